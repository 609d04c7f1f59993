"""Paired bootstrap intervals of a difference between two rows: the point estimate against the metrics, a row
against itself, a row better everywhere, the seed stage, one seed, determinism, edge cases,
the rows' logits read from each seed and the rendered lines with their verdicts."""

import json
import math
import statistics

import pytest
import torch

from hydra_ensembles import metrics as M
from hydra_ensembles.evaluation import Interval, difference_lines, paired_bootstrap
from hydra_ensembles.evaluation.bootstrap import _differences, _t_interval, _Terms, row_differences, t_quantile, verdict
from hydra_ensembles.evaluation.compare import row_file
from hydra_ensembles.evaluation.ood import OOD_SCORES
from hydra_ensembles.uncertainty import ensemble_probs


def _run(seed, n=60, members=3, classes=4, tied=False):
    """What `report.measure` saves for one row on one seed: test logits and OOD sets in each group."""
    g = torch.Generator().manual_seed(seed)

    def logits(count, shift=0.0):
        x = torch.randn(count, members, classes, generator=g) * 2 + shift
        return x.round().clamp(-1, 1) if tied else x  # logits in {-1, 0, 1}: many equal MSP scores (AUROC ties)

    return {"test": logits(n, 1.0), "near": {"a": logits(30)}, "far": {"b": logits(20)}, "ood": {"c": logits(25)}}


LABELS = torch.arange(60) % 4


def _table_metrics(run, labels):
    """NLL, ECE and all-OOD AUROC of one run, by the metric functions the tables use."""
    probs = ensemble_probs(run["test"].double())
    msp = OOD_SCORES["msp"]
    sets = [scores for group in ("near", "far", "ood") for scores in run[group].values()]
    aurocs = [
        M.auroc(
            torch.cat([msp(run["test"]), msp(s)]), torch.cat([torch.zeros(len(run["test"])), torch.ones(len(s))]).bool()
        )
        for s in sets
    ]
    return {"nll": M.nll(probs, labels), "ece": M.ece(probs, labels), "auroc_all": statistics.fmean(aurocs)}


@pytest.mark.parametrize("tied", [False, True])
def test_the_point_estimate_is_the_difference_of_the_tables_metrics(tied):
    a, b = [_run(s, tied=tied) for s in (0, 1, 2)], [_run(s, tied=tied) for s in (10, 11, 12)]
    said = paired_bootstrap(a, b, LABELS, resamples=50)
    for metric in ("nll", "ece", "auroc_all"):
        expected = statistics.fmean(_table_metrics(x, LABELS)[metric] for x in a) - statistics.fmean(
            _table_metrics(y, LABELS)[metric] for y in b
        )
        assert said[metric].point == pytest.approx(expected, abs=1e-12)
        assert said[metric].low < said[metric].point < said[metric].high  # rows that differ at random


@pytest.mark.parametrize("tied", [False, True])
def test_each_resample_is_the_tables_metrics_on_the_examples_it_drew(tied):
    """The point estimate only checks the identity resample (every example drawn once): a resample that repeats
    examples (e.g. AUROC counting each drawn test example once, not as often as drawn) went unchecked."""
    a, b = _run(0, tied=tied), _run(1, tied=tied)
    first, second = (_Terms.of(run, LABELS, 15) for run in (a, b))
    g = torch.Generator().manual_seed(5)
    test = torch.randint(60, (4, 60), generator=g)  # (R, N): repeats and omissions
    ood = {name: torch.randint(len(scores), (4, len(scores)), generator=g) for name, scores in _sets(a).items()}
    drawn = _differences(first, second, test, ood)

    def on_draw(run, r):
        resampled = {"test": run["test"][test[r]]} | {
            group: {name: sets[name][ood[name][r]] for name in sets} for group, sets in run.items() if group != "test"
        }
        return _table_metrics(resampled, LABELS[test[r]])

    for r in range(4):
        mine, theirs = on_draw(a, r), on_draw(b, r)
        for metric in ("nll", "ece", "auroc_all"):
            assert drawn[metric][r].item() == pytest.approx(mine[metric] - theirs[metric], abs=1e-12)


def _sets(run):
    return {name: scores for group in ("near", "far", "ood") for name, scores in run[group].items()}


def test_the_degrees_of_freedom_combine_both_variances_as_welch_satterthwaite():
    """The limits (no example spread: S - 1; no seed spread: the normal) pass with a wrong exponent on the
    ratio: a case with both spreads checks the formula, df = (v_e + v_s)^2 (S - 1) / v_s^2, against scipy."""
    scipy_stats = pytest.importorskip("scipy.stats")
    points = torch.tensor([0.01, 0.03, 0.02], dtype=torch.float64)
    drawn = torch.randn(2000, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.01 + points
    v_examples, v_seeds = drawn.mean(dim=1).var().item(), points.var().item() / 3
    assert 0.1 < v_examples / v_seeds < 10  # both spreads matter
    df = (v_examples + v_seeds) ** 2 * 2 / v_seeds**2
    half = scipy_stats.t.ppf(0.975, df) * math.sqrt(v_examples + v_seeds)
    said = _t_interval(points, drawn, 0.95)
    assert said.low == pytest.approx(0.02 - half, rel=1e-5) and said.high == pytest.approx(0.02 + half, rel=1e-5)


def test_a_row_against_itself_differs_by_exactly_zero():
    runs = [_run(s) for s in (0, 1, 2)]
    for interval in paired_bootstrap(runs, runs, LABELS, resamples=200).values():
        assert tuple(interval) == (0.0, 0.0, 0.0)  # paired: both rows see the same examples in every resample


def _confident(target, count, noise_seed, classes=4):
    """Logits (count, 2, classes) putting +3 on `target` (count,), with small noise: ~87 % confident."""
    g = torch.Generator().manual_seed(noise_seed)
    x = torch.randn(count, 2, classes, generator=g) * 0.1
    x[torch.arange(count), :, target] += 3.0
    return x


def test_a_row_better_on_every_example_has_an_interval_clear_of_zero():
    labels = torch.arange(40) % 4
    a, b = [], []
    for s in range(3):
        uniform = torch.randn(30, 2, 4, generator=torch.Generator().manual_seed(s)) * 0.1  # OOD: A unsure
        a.append({"test": _confident(labels, 40, s), "far": {"x": uniform}})  # right, ~87 % confident
        b.append({"test": _confident((labels + 1) % 4, 40, s), "far": {"x": _confident(labels[:30], 30, s + 9)}})
    said = paired_bootstrap(a, b, labels, resamples=300)
    assert said["nll"].high < 0 and said["ece"].high < 0  # A - B: lower NLL and ECE on every resample
    assert said["auroc_all"].low > 0  # and higher AUROC


def test_the_seeds_spread_enters_as_a_t_interval_on_their_degrees_of_freedom():
    """Every example of a seed identical: resampling examples changes nothing, so the interval is the seeds'
    spread alone. Differences +d and -d: sample variance 2 d^2, over S = 2: d^2; one degree of freedom:
    0 +- t(0.975, 1) d = +-12.706 d (resampling 2 seeds from 2 said +-d)."""
    sure, unsure = torch.tensor([[[2.0, 0.0]]]).expand(5, 1, 2), torch.tensor([[[1.0, 0.0]]]).expand(5, 1, 2)
    labels = torch.zeros(5, dtype=torch.long)
    said = paired_bootstrap([{"test": sure}, {"test": unsure}], [{"test": unsure}, {"test": sure}], labels)
    d = M.nll(unsure.softmax(-1)[:, 0], labels) - M.nll(sure.softmax(-1)[:, 0], labels)
    assert said["nll"].point == pytest.approx(0.0, abs=1e-15)
    assert said["nll"].low == pytest.approx(-12.7062 * d, rel=1e-4) and said["nll"].high == pytest.approx(
        12.7062 * d, rel=1e-4
    )
    assert "auroc_all" not in said  # no OOD sets


def test_equal_rows_read_better_or_worse_about_as_often_as_the_level_says():
    """Rows A and B of one model, each seed's logits at a temperature of its own (U(0.7, 1.3)): equal in
    expectation. Over 40 such comparisons of 3 seeds, a 95 % interval should exclude 0 about 2 times; resampling
    the 3 seeds said so 10 times for NLL and for ECE (its interval was about [lowest seed, highest seed])."""
    excluded = {"nll": 0, "ece": 0}

    def row(base, ood, g):
        return [{"test": base * t, "far": {"x": ood * t}} for t in (0.7 + 0.6 * torch.rand(3, generator=g)).tolist()]

    for trial in range(40):
        g = torch.Generator().manual_seed(trial)
        base, labels = torch.randn(200, 1, 4, generator=g) * 2, torch.randint(0, 4, (200,), generator=g)
        ood = torch.randn(50, 1, 4, generator=g)
        said = paired_bootstrap(row(base, ood, g), row(base, ood, g), labels, resamples=200, seed=trial)
        for metric in excluded:
            excluded[metric] += verdict(metric, said[metric]) != "not separated"
    assert excluded["nll"] <= 5 and excluded["ece"] <= 5, excluded


def test_t_quantile_matches_scipys():
    scipy_stats = pytest.importorskip("scipy.stats")
    for p in (0.5, 0.8, 0.95, 0.975, 0.995, 0.9995, 0.9999):  # far tails at df 1: x in the thousands
        for df in (1, 1.5, 2, 2.7, 5, 30, 1000, 1e6):
            assert t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=2e-6, abs=1e-9)
    assert t_quantile(0.975, math.inf) == pytest.approx(1.959964, abs=1e-6)
    with pytest.raises(ValueError, match="df >= 1"):
        t_quantile(0.975, 0.5)


def test_seeds_that_agree_to_float_noise_give_the_examples_interval_not_a_blown_up_one():
    """Three seeds holding the same run: their differences agree to float noise (sample variance ~1e-34, not 0),
    so Welch-Satterthwaite's degrees of freedom run to ~1e60. The interval is the examples' (normal quantile):
    it once came out as +-1e48, from t_quantile evaluated far past what its integration grid resolves."""
    assert t_quantile(0.975, 1e8) == pytest.approx(1.959964, abs=1e-6)
    assert t_quantile(0.975, 1e60) == pytest.approx(1.959964, abs=1e-6)
    runs = [_run(3), _run(4)]
    said = paired_bootstrap([runs[0]] * 3, [runs[1]] * 3, LABELS, resamples=400)
    one = paired_bootstrap([runs[0]], [runs[1]], LABELS, resamples=400)
    for metric, interval in said.items():
        width, one_width = interval.high - interval.low, one[metric].high - one[metric].low
        assert math.isfinite(width) and 0.5 * one_width < width < 2 * one_width, (metric, interval, one[metric])


def test_seeds_that_share_the_test_set_share_each_resamples_examples():
    """One test set for every seed (one labels tensor): copies of a seed add nothing, so S copies give one seed's
    interval (up to the Monte Carlo error of other draws). Drawing each seed's examples apart would average a hard
    example's error away over the copies and narrow it by ~sqrt(S) (the nested design, right only for seeds with
    test sets of their own)."""
    a, b = _run(0), _run(10)

    def widths(*args):
        return {m: i.high - i.low for m, i in paired_bootstrap(*args, resamples=2000).items()}

    one, copies = widths([a], [b], LABELS), widths([a] * 3, [b] * 3, LABELS)
    nested = widths([a] * 3, [b] * 3, [LABELS] * 3)  # three test sets that happen to agree
    for metric, width in one.items():
        assert copies[metric] == pytest.approx(width, rel=0.1)
        assert nested[metric] < 0.75 * width  # ~1/sqrt(3) = 0.58
    nested_one = paired_bootstrap([a], [b], [LABELS], resamples=100)  # one seed: the two designs are one
    assert nested_one == paired_bootstrap([a], [b], LABELS, resamples=100)


def test_the_examples_are_resampled_on_the_id_side_too():
    a, b = ({"test": r["test"], "far": {"b": r["far"]["b"][:1].expand(20, -1, -1)}} for r in (_run(0), _run(10)))
    auroc = paired_bootstrap([a, a], [b, b], LABELS, resamples=200)["auroc_all"]  # OOD sets of copies: the ID side
    assert auroc.low < auroc.point < auroc.high


def test_seeds_said_to_share_their_sets_must_have_the_same_sizes():
    a, short = _run(0), _run(1) | {"far": {"b": _run(1)["far"]["b"][:10]}}
    with pytest.raises(ValueError, match="run 1 has 60 test examples and OOD sets .* pass one labels tensor per seed"):
        paired_bootstrap([a, short], [a, short], LABELS)


def test_the_interval_is_reproducible_by_seed():
    a, b = [_run(s) for s in (0, 1)], [_run(s) for s in (5, 6)]
    first, again = paired_bootstrap(a, b, LABELS, resamples=100, seed=3), paired_bootstrap(a, b, LABELS, 100, seed=3)
    other = paired_bootstrap(a, b, LABELS, resamples=100, seed=4)
    assert first == again and first != other and first["nll"].point == other["nll"].point


def test_too_little_to_resample_is_refused_with_the_fix():
    runs = [_run(0), _run(1)]
    with pytest.raises(ValueError, match="no runs to compare"):
        paired_bootstrap([], [], LABELS)
    one = [{"test": r["test"][:1]} for r in runs]
    with pytest.raises(ValueError, match="at least 2 examples.*got 1 examples and 1 labels"):
        paired_bootstrap(one, one, LABELS[:1])
    small = [r | {"far": {"b": r["far"]["b"][:1]}} for r in runs]
    with pytest.raises(ValueError, match=r"OOD set\(s\) \['b'\] have fewer than 2 examples"):
        paired_bootstrap(small, small, LABELS)
    with pytest.raises(ValueError, match="measured on different data.*pair runs of the same task"):
        paired_bootstrap(runs, [r | {"ood": {}} for r in runs], LABELS)
    with pytest.raises(ValueError, match="same seeds, got 2 and 1"):
        paired_bootstrap(runs, runs[:1], LABELS)
    with pytest.raises(ValueError, match="one per seed \\(2\\), got 3"):
        paired_bootstrap(runs, runs, [LABELS] * 3)
    with pytest.raises(ValueError, match=r"integer class ids in \[0, 4\)"):  # was truncated by .long()
        paired_bootstrap(runs, runs, LABELS.double() + 0.6)
    clash = [r | {"ood": {"a": r["ood"]["c"]}} for r in runs]  # "a" in near and in ood: one was dropped
    with pytest.raises(ValueError, match=r"OOD set name\(s\) \['a'\] are given twice"):
        paired_bootstrap(clash, clash, LABELS)


def test_one_seed_resamples_its_examples_only():
    """Two test examples, A - B of NLL 0 on the first and -g on the second: the mean over the 2 examples drawn is
    0, -g / 2 or -g (1/4, 1/2, 1/4), so the interval is [-g, 0] around -g / 2."""
    sure, unsure = torch.tensor([[[2.0, 0.0]]]), torch.tensor([[[1.0, 0.0]]])
    labels = torch.zeros(2, dtype=torch.long)
    said = paired_bootstrap([{"test": torch.cat([sure, sure])}], [{"test": torch.cat([sure, unsure])}], labels)["nll"]
    g = M.nll(unsure.softmax(-1)[:, 0], labels[:1]) - M.nll(sure.softmax(-1)[:, 0], labels[:1])
    assert said.point == pytest.approx(-g / 2) and said.low == pytest.approx(-g) and said.high == pytest.approx(0.0)


def test_one_seeds_interval_holds_its_point_and_narrows_with_more_examples():
    width = {}
    for n in (60, 960):
        labels = torch.arange(n) % 4
        a, b = (_run(s, n=n) for s in (0, 10))
        said = paired_bootstrap([a], [b], labels, resamples=400)
        for metric in ("nll", "ece"):
            expected = _table_metrics(a, labels)[metric] - _table_metrics(b, labels)[metric]
            assert said[metric].point == pytest.approx(expected, abs=1e-12)
            assert said[metric].low < said[metric].point < said[metric].high
        width[n] = {metric: interval.high - interval.low for metric, interval in said.items()}
    assert all(width[960][m] < width[60][m] / 2 for m in ("nll", "ece"))  # sqrt(16) = 4 times narrower, about


def test_row_differences_read_the_seeds_logits_skip_missing_rows_and_keep_as_json(tmp_path):
    seed_dirs = {s: tmp_path / f"seed{s}" for s in (3, 4)}
    for s, folder in enumerate(seed_dirs.values()):
        (folder / "logits").mkdir(parents=True)
        torch.save(_run(s), row_file(folder / "logits", "Hydra (Circ)"))
        torch.save(_run(s + 10), row_file(folder / "logits", "Single"))
    torch.save(_run(20), row_file(seed_dirs[3] / "logits", "Hydra (Taylor)"))  # on one seed of two: left out
    pairs = [("Hydra (Circ)", "Single"), ("Hydra (Taylor)", "Single")]
    said = row_differences(seed_dirs, LABELS, pairs, resamples=50)
    expected = paired_bootstrap([_run(0), _run(1)], [_run(10), _run(11)], LABELS, resamples=50)
    assert said == {
        "resamples": 50,
        "level": 0.95,
        "seeds": [3, 4],
        "examples": "shared",
        "pairs": [{"rows": ["Hydra (Circ)", "Single"]} | {m: i._asdict() for m, i in expected.items()}],
    }
    assert json.loads(json.dumps(said)) == said  # a results file keeps it as it is
    assert row_differences(seed_dirs, LABELS, pairs[1:]) == {}  # nothing to compare: nothing said


def test_row_differences_read_a_seeds_stand_in_files_and_say_so(tmp_path):
    """A seed whose row B was made again (another build) reads the stand-in named for it; the others their own."""
    seed_dirs = {s: tmp_path / f"seed{s}" for s in (0, 1)}
    for s, folder in seed_dirs.items():
        (folder / "logits").mkdir(parents=True)
        torch.save(_run(s), row_file(folder / "logits", "Hydra (Taylor)"))
        torch.save(_run(s + 10), row_file(folder / "logits", "Single"))
    torch.save(_run(30), row_file(seed_dirs[1] / "logits", "Single, trained again"))
    pair = ("Hydra (Taylor)", "Single")
    stand_ins = {pair: {1: ("Hydra (Taylor)", "Single, trained again")}}
    said = row_differences(seed_dirs, LABELS, [pair], resamples=50, stand_ins=stand_ins)
    expected = paired_bootstrap([_run(0), _run(1)], [_run(10), _run(30)], LABELS, resamples=50)
    assert said["pairs"] == [
        {"rows": list(pair), "stand_ins": {"1": ["Hydra (Taylor)", "Single, trained again"]}}
        | {m: i._asdict() for m, i in expected.items()}
    ]
    assert json.loads(json.dumps(said)) == said
    lines = difference_lines(said | {"pairs": [said["pairs"][0] | {"builds_apart": [0, 2]}]})
    assert '"X as B" says that seed\'s row B was read from X' in lines[0]
    assert lines[2].startswith(
        "- Hydra (Taylor) vs Single (seed 1: Single, trained again as Single; different builds: seeds 0, 2): NLL "
    ), lines[2]
    plain = row_differences(seed_dirs, LABELS, [pair], resamples=50)  # its own files: nothing said of builds
    assert "stand_ins" not in plain["pairs"][0] and "as B" not in difference_lines(plain)[0]
    assert plain["pairs"][0]["nll"] != said["pairs"][0]["nll"]


def test_difference_lines_say_what_was_resampled_and_each_verdict():
    def interval(point, low, high):
        return {"point": point, "low": low, "high": high}

    differences = {
        "resamples": 2000,
        "level": 0.95,
        "seeds": [0, 1, 2],
        "pairs": [
            {
                "rows": ["Hydra (Circ)", "Single"],
                "nll": interval(-0.012, -0.02, -0.004),
                "ece": interval(0.002, 0.001, 0.003),
                "auroc_all": interval(0.01, -0.004, 0.02),
            },
            {
                "rows": ["CircAvg", "Single"],
                "nll": interval(0.0, -0.001, 0.001),
                "auroc_all": interval(-0.02, -0.03, -0.01),
            },
        ],
    }
    header, blank, *lines = difference_lines(differences)
    assert header.startswith(
        "Differences, Student's t 95 % interval (the test examples' bootstrap variance (one draw for every seed, "
        "paired) plus the 3 seeds' variance / 3, Welch-Satterthwaite degrees of freedom: few seeds, wide intervals; "
        "2000 resamples). "
    )
    assert blank == "" and lines == [
        "- Hydra (Circ) vs Single: NLL -0.012 [-0.020, -0.004], better; ECE 0.2 [0.1, 0.3] %, worse; "
        "AUROC all 1.0 [-0.4, 2.0] %, not separated",
        "- CircAvg vs Single: NLL 0.000 [-0.001, 0.001], not separated; AUROC all -2.0 [-3.0, -1.0] %, worse",
    ]
    nested = difference_lines(differences | {"examples": "per seed"})[0]
    assert "(the test examples' bootstrap variance (each seed's own, paired) plus the 3 seeds'" in nested
    one = difference_lines(differences | {"seeds": [0]})[0]
    assert "(one seed: test examples resampled only, so retraining" in one
    assert verdict("auroc_all", Interval(0.01, 0.004, 0.02)) == "better"
    near_zero = {"rows": ["A", "B"], "auroc_all": interval(-0.018, -0.037, -0.0004)}  # worse: not printed as -0.0
    assert (
        difference_lines(differences | {"pairs": [near_zero]})[2] == "- A vs B: AUROC all -1.8 [-3.7, -0.04] %, worse"
    )
    assert verdict("ece", Interval(0.0, 0.0, 0.0)) == "not separated"  # a row against itself


def test_a_point_that_rounds_to_zero_has_no_sign():
    """ "AUROC all -0.0 [-8.0, 7.9]" read as a direction the point does not have."""
    pair = {"rows": ["A", "B"], "auroc_all": {"point": -0.0003, "low": -0.08, "high": 0.079}}
    differences = {"resamples": 10, "level": 0.95, "seeds": [0], "pairs": [pair]}
    assert difference_lines(differences)[2] == "- A vs B: AUROC all 0.0 [-8.0, 7.9] %, not separated"
