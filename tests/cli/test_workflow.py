"""The whole `hydra-ens` workflow in subprocesses on a tiny BERT, each step checked against the library called
in-process on the same files (a command must do exactly what its Python counterpart does)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
from cli_support import (
    TOPICS,
    hydra_ens,
    image_classifier,
    image_files,
    text_encoder,
    text_files,
)
from tolerances import CONTRACT

import hydra_ensembles as he
from hydra_ensembles import metrics
from hydra_ensembles import training as ft
from hydra_ensembles.cli.predict import id_threshold
from hydra_ensembles.cli.step import RECORD
from hydra_ensembles.data.files import label_ids, read_encoded, read_examples, text_batches
from hydra_ensembles.evaluation.ood import OOD_SCORES
from hydra_ensembles.outputs import collect_member_logits
from hydra_ensembles.predictors import load_classifier, load_predictor, load_preprocessor
from hydra_ensembles.training import TEXT_RECIPE


@pytest.fixture(scope="module")
def flow(tmp_path_factory, text_files, text_encoder):
    root = tmp_path_factory.mktemp("flow")
    d = {
        name: str(root / name)
        for name in (
            "single",
            "scores",
            "circuit",
            "members",
            "members-circ",
            "members-default",
            "members-trunk",
            "tuned",
            "hydra",
            "hydra-exact",
            "hydra-average",
            "report",
        )
    }
    f = {k: str(v) for k, v in text_files.items()}

    def from_circuit(out: str, *flags: str):
        return hydra_ens("members", "--model", d["single"], "--circuit", d["circuit"], *flags, "--out", d[out])

    runs = {
        "finetune": hydra_ens(
            "finetune",
            "--model",
            str(text_encoder),
            "--data",
            f["train"],
            "--val",
            f["val"],
            "--epochs",
            "8",
            "--lr",
            "3e-3",
            "--patience",  # a tiny random encoder sits at chance accuracy for its first epochs: no early stop
            "8",
            "--out",
            d["single"],
        ),
        "scores": hydra_ens("scores", "--model", d["single"], "--data", f["val"], "--out", d["scores"]),
        "circuit": hydra_ens(
            "circuit",
            "--model",
            d["single"],
            "--data",
            f["val"],
            "--ood",
            f["ood"],
            "--budget",
            "5",
            "--out",
            d["circuit"],
        ),
        "members": hydra_ens(
            "members",
            "--model",
            d["single"],
            "--scores",
            d["scores"],
            "--num-members",
            "3",
            "--budget",
            "2",
            "--pool",
            "3",
            "--out",
            d["members"],
        ),
        "members-circ": from_circuit("members-circ", "--budget", "4", "--pool", "5"),
        "members-default": from_circuit("members-default"),
        "members-trunk": from_circuit("members-trunk", "--budget", "2", "--pool", "5", "--trunk", "1"),
        "fuse-exact": hydra_ens("fuse", "--members", d["members"], "--out", d["hydra-exact"]),
        "tune": hydra_ens(
            "finetune",
            "--model",
            d["members"],
            "--data",
            f["train"],
            "--epochs",
            "1",
            "--lr",
            "1e-3",
            "--freeze-embeddings",
            "--precision",
            "bf16",
            "--out",
            d["tuned"],
        ),
        "fuse": hydra_ens("fuse", "--members", d["tuned"], "--mlp", "stack", "--out", d["hydra"]),
        "fuse-average-blind": hydra_ens("fuse", "--members", d["tuned"], "--out", d["hydra-average"], check=False),
        "fuse-average": hydra_ens("fuse", "--members", d["tuned"], "--data", f["val"], "--out", d["hydra-average"]),
        "evaluate": hydra_ens(
            "evaluate",
            "--model",
            f"single={d['single']}",
            "--model",
            f"hydra={d['hydra']}",
            "--data",
            f["test"],
            "--text-column",
            "review",
            "--ood",
            f["ood"],
            "--out",
            d["report"],
        ),
        "predict": hydra_ens("predict", "--model", d["hydra"], "--inputs", f["new"], "--calibration", f["val"]),
        "predict-jsonl": hydra_ens(
            "predict",
            "--model",
            d["hydra"],
            "--inputs",
            f["new"],
            "--calibration",
            f["val"],
            "--format",
            "jsonl",
            "--output",
            str(root / "predictions.jsonl"),
        ),
    }
    return root, d, f, runs


def batches(path, model, text_column="text", labelled=True):
    from transformers import AutoTokenizer

    examples = read_examples(path, text_column, "label" if labelled and not str(path).endswith(".txt") else None)
    config = model.model_config if isinstance(model, he.HydraEnsemble) else model.config
    labels = label_ids(examples.labels, config.label2id) if examples.labels else None
    return text_batches(AutoTokenizer.from_pretrained(DIRS["tokenizer"]), examples.inputs, labels, 16, 128)


DIRS: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _tokenizer_dir(text_encoder):
    DIRS["tokenizer"] = str(text_encoder)


def test_finetune_gives_the_encoder_a_head_over_the_data_classes_and_learns(flow):
    root, d, f, runs = flow
    single = he.load_model(f"{d['single']}/model")
    assert single.config.id2label == dict(enumerate(sorted(TOPICS)))
    assert "new classification head over 3 classes" in runs["finetune"].stdout
    test = batches(f["test"], single, "review")
    logits = collect_member_logits(single, test)
    assert metrics.accuracy(he.ensemble_probs(logits), torch.cat([b["labels"] for b in test])) >= 0.9


def test_scores_equal_the_library_on_the_same_file(flow):
    root, d, f, runs = flow
    single = he.load_model(f"{d['single']}/model")
    saved = safetensors.torch.load_file(f"{d['scores']}/scores.safetensors")["scores"]
    # by default the paper's sequential scores, pruning a third of each layer's 4 heads before the next is scored
    expected = he.taylor_head_scores(single, batches(f["val"], single), sequential_budget=1, progress=False)
    torch.testing.assert_close(saved, expected)
    assert json.loads((root / "scores" / "scores.json").read_text())["sequential"] == 1
    assert (root / "scores" / "head_importance.png").stat().st_size > 0


def test_sequential_0_gives_the_one_shot_scores_of_the_library(flow, tmp_path):
    root, d, f, runs = flow
    out = tmp_path / "scores-one-shot"
    hydra_ens("scores", "--model", f"{d['single']}/model", "--data", f["val"], "--sequential", "0", "--out", str(out))
    single = he.load_model(f"{d['single']}/model")
    expected = he.taylor_head_scores(single, batches(f["val"], single), progress=False)
    torch.testing.assert_close(safetensors.torch.load_file(f"{out}/scores.safetensors")["scores"], expected)
    assert json.loads((out / "scores.json").read_text())["sequential"] is None


def test_circuit_equals_the_library_on_the_same_files(flow):
    root, d, f, runs = flow
    single = he.load_model(f"{d['single']}/model")
    expected = he.extract_circuit(
        single, batches(f["val"], single), batches(f["ood"], single, labelled=False), "avg", 5, progress=False
    )
    saved = he.Circuit.load(f"{d['circuit']}/circuit.json")
    assert saved.removed == expected.removed
    assert saved.scores == pytest.approx(expected.scores)
    assert saved.ties == expected.ties and len(saved.ties) == 5
    assert json.loads((root / "circuit" / RECORD).read_text())["results"]["ties"] == expected.ties
    assert expected.tie_note() and expected.tie_note() in runs["circuit"].stdout  # said even with --quiet


def test_members_are_the_sampled_head_maps_pruned_from_the_model(flow):
    root, d, f, runs = flow
    scores = safetensors.torch.load_file(f"{d['scores']}/scores.safetensors")["scores"]
    expected = he.sample_members(scores, num_members=3, budget=2, pool=3, seed=0)
    index = json.loads((root / "members" / "members.json").read_text())
    assert [{int(k): v for k, v in h.items()} for h in index["head_maps"]] == expected
    for name, head_map in zip(index["members"], expected):
        assert he.kept_heads(he.load_model(root / "members" / name)) == head_map
    circuit = he.Circuit.load(f"{d['circuit']}/circuit.json")
    from_circuit = json.loads((root / "members-circ" / "members.json").read_text())["head_maps"]
    expected = he.sample_members(circuit, num_members=3, budget=4, pool=5, seed=0)
    assert [{int(k): v for k, v in h.items()} for h in from_circuit] == expected


def test_every_step_that_saves_a_model_writes_its_card(flow):
    """`finetune`, `members` and `fuse` saved no model card (only `save_predictor`'s callers did): a user's
    fused ensemble said nothing of its members, heads kept or cost."""
    root, d, f, runs = flow
    cards = {
        name: (Path(path) / "README.md").read_text()
        for name, path in {
            "finetune": f"{d['single']}/model",
            "members": f"{d['members']}/member0",
            "members, fine-tuned": f"{d['tuned']}/member0",
            "fuse": f"{d['hydra']}/ensemble",
        }.items()
    }
    assert all(card.startswith("---\nlibrary_name: hydra-ensembles\n") for card in cards.values())
    assert f"head selection: Taylor head scores `{d['scores']}/scores.safetensors`" in cards["members"]
    assert f"head selection: Taylor head scores `{d['scores']}/scores.safetensors`" in cards["members, fine-tuned"]
    assert "A Hydra Ensemble of 3 pruned" in cards["fuse"] and "## Cost relative to the base model" in cards["fuse"]
    loading = cards["fuse"].split("load it with `")[1].split("`")[0]  # what the card tells a reader to run
    assert loading == "hydra_ensembles.predictors.load_predictor(path)"
    assert he.predictors.load_predictor(f"{d['hydra']}/ensemble").num_members == 3


def test_members_from_a_circuit_with_default_settings_are_distinct_and_use_the_ranking(flow):
    root, d, f, runs = flow
    circuit = he.Circuit.load(f"{d['circuit']}/circuit.json")  # 8 heads, 5 ranked
    maps = [
        {int(k): v for k, v in h.items()}
        for h in json.loads((root / "members-default" / "members.json").read_text())["head_maps"]
    ]
    assert len({str(m) for m in maps}) == 3  # distinct
    for head_map in maps:  # a third of the 8 heads (2), from the 4 least useful (twice the budget)
        pruned = {(layer, h) for layer, heads in circuit.kept.items() for h in heads if h not in head_map[layer]}
        assert len(pruned) == 2 and pruned <= set(circuit.removed[:4])
    assert maps == he.sample_members(circuit, seed=0)


def test_members_with_a_trunk_share_their_first_layers_and_fuse_with_them_run_once(flow):
    root, d, f, runs = flow
    circuit = he.Circuit.load(f"{d['circuit']}/circuit.json")
    index = json.loads((root / "members-trunk" / "members.json").read_text())
    maps = [{int(k): v for k, v in h.items()} for h in index["head_maps"]]
    assert maps == he.sample_members(circuit, num_members=3, budget=2, pool=5, seed=0, trunk=1)
    assert all(m[0] == circuit.head_map(2)[0] for m in maps)  # layer 0: the heads the circuit's first 2 keep
    members = [he.load_model(root / "members-trunk" / name) for name in index["members"]]
    assert he.HydraEnsemble.fuse(members).trunk == 1


def test_fuse_says_whether_the_fused_model_is_exact_and_measures_how_far_it_is(flow):
    root, d, f, runs = flow
    assert "exact by construction" in runs["fuse-exact"].stdout  # members not fine-tuned share their MLPs
    blind = runs["fuse-average-blind"]  # members fine-tuned apart, averaged, nothing to measure on
    assert blind.returncode == 2 and "pass --data" in blind.stderr and "--mlp stack" in blind.stderr
    line = runs["fuse-average"].stdout
    record = json.loads((root / "hydra-average" / "hydra-ens.json").read_text())["results"]
    assert record["averaged_tensors"] > 0
    ensemble = he.HydraEnsemble.from_pretrained(root / "hydra-average" / "ensemble")
    members = [he.load_model(root / "tuned" / f"member{i}") for i in range(3)]
    expected = he.fusion_deviation(ensemble, members, batches(f["val"], ensemble))
    assert record["deviation"]["logits"] == pytest.approx(expected["logits"])
    assert record["deviation"]["probs"] == pytest.approx(expected["probs"])
    assert f"max |logit difference| {expected['logits']:.3g}" in line and "--mlp stack is exact" in line
    stacked = json.loads((root / "hydra" / "hydra-ens.json").read_text())["results"]
    assert stacked["averaged_tensors"] == 0 and "exact by construction" in runs["fuse"].stdout


def test_finetune_says_which_epoch_it_kept_and_why(flow):
    root, d, f, runs = flow
    history = json.loads((root / "single" / "hydra-ens.json").read_text())["results"]["history"]["model"]
    kept, epochs = history["kept_epoch"], history["epochs"]
    best = max(e["val_acc"] for e in epochs)  # the text recipe's rule: highest accuracy, ties to the lower NLL
    chosen = next(e for e in epochs if e["epoch"] == kept)
    assert chosen["val_acc"] == best
    assert all(e["val_nll"] >= chosen["val_nll"] - TEXT_RECIPE.min_delta for e in epochs if e["val_acc"] == best)
    assert f"kept epoch {kept} of {len(history['epochs'])}: highest validation accuracy" in runs["finetune"].stdout
    assert "ties go to the lower NLL" in runs["finetune"].stdout
    tuned = json.loads((root / "tuned" / "hydra-ens.json").read_text())["settings"]["recipe"]
    single = json.loads((root / "single" / "hydra-ens.json").read_text())["settings"]["recipe"]
    assert tuned["precision"] == "bf16" and "precision" not in single  # members tuned with --precision bf16


def test_scores_writes_the_scores_json_the_docs_promise(flow):
    root, d, f, runs = flow
    saved = json.loads((root / "scores" / "scores.json").read_text())
    scores = safetensors.torch.load_file(f"{d['scores']}/scores.safetensors")["scores"]
    assert torch.equal(torch.tensor(saved["scores"], dtype=scores.dtype), scores)  # float32 -> JSON -> float32
    assert saved["least_useful_first"]["0"] == sorted(range(scores.shape[1]), key=lambda h: scores[0, h].item())


def test_fused_ensemble_equals_its_fine_tuned_members_run_one_by_one(flow):
    root, d, f, runs = flow
    ensemble = he.HydraEnsemble.from_pretrained(f"{d['hydra']}/ensemble")
    members = [he.load_model(root / "tuned" / f"member{i}") for i in range(3)]
    untuned = he.load_model(root / "members" / "member0")
    test = batches(f["test"], members[0], "review")
    fused = collect_member_logits(ensemble, test)
    one_by_one = torch.cat([collect_member_logits(m, test) for m in members], dim=1)
    torch.testing.assert_close(fused, one_by_one, atol=CONTRACT, rtol=0)  # contract 3 (tests/tolerances.py)
    assert not torch.allclose(collect_member_logits(untuned, test)[:, 0], one_by_one[:, 0])  # tuning changed it


def test_fuse_then_fine_tune_as_one_module_equals_the_library_and_its_rebuilt_members(flow, tmp_path):
    root, d, f, runs = flow
    out = tmp_path / "hydra-tuned"
    run = hydra_ens("fuse", "--members", d["members"], "--finetune-train", f["train"], "--finetune-val", f["val"],
                    "--epochs", "2", "--lr", "1e-3", "--out", str(out))  # fmt: skip
    exact, training = (run.stdout.find(said) for said in ("exact by construction", "fine-tuning the fused ensemble"))
    assert -1 < exact < training  # the exactness line is said before the training starts
    assert "kept epoch" in run.stdout and not (out / "checkpoints").exists()
    record = json.loads((out / RECORD).read_text())["results"]
    assert record["averaged_tensors"] == 0 and 1 <= len(record["finetune"]["epochs"]) <= 2
    members = [he.load_model(root / "members" / f"member{i}") for i in range(3)]
    library = he.HydraEnsemble.fuse(members)
    recipe = TEXT_RECIPE.with_(epochs=2, lr=1e-3, seed=0)
    ft.finetune_fused(
        library, batches(f["train"], library), recipe, val_loader=batches(f["val"], library), progress=False
    )
    test = batches(f["test"], library, "review")
    saved = collect_member_logits(load_predictor(out / "ensemble"), test)
    torch.testing.assert_close(saved, collect_member_logits(library, test), atol=CONTRACT, rtol=0)
    rebuilt = torch.cat([collect_member_logits(m, test) for m in library.unfuse(members)], dim=1)
    torch.testing.assert_close(saved, rebuilt, atol=CONTRACT, rtol=0)  # still exactly an ensemble of its members
    untuned = torch.cat([collect_member_logits(m, test) for m in members], dim=1)
    assert (saved - untuned).abs().max() > 100 * CONTRACT  # fine-tuning moved them
    bad = hydra_ens("fuse", "--members", d["members"], "--epochs", "2", "--out", str(tmp_path / "bad"), check=False)
    assert bad.returncode == 2 and "add --finetune-train" in bad.stderr


def test_evaluate_reports_the_metrics_of_each_model(flow):
    root, d, f, runs = flow
    saved = json.loads((root / "report" / "metrics.json").read_text())["results"]
    ensemble = he.HydraEnsemble.from_pretrained(f"{d['hydra']}/ensemble")
    test, ood = batches(f["test"], ensemble, "review"), batches(f["ood"], ensemble, labelled=False)
    logits, labels = collect_member_logits(ensemble, test), torch.cat([b["labels"] for b in test])
    probs = he.ensemble_probs(logits)
    assert saved["hydra"]["metrics"]["id"]["acc"] == pytest.approx(metrics.accuracy(probs, labels))
    assert saved["hydra"]["metrics"]["id"]["nll"] == pytest.approx(metrics.nll(probs, labels), rel=1e-5)
    ood_logits = collect_member_logits(ensemble, ood)
    is_ood = torch.cat([torch.zeros(len(logits)), torch.ones(len(ood_logits))]).bool()
    msp = OOD_SCORES["msp"]
    auroc = metrics.auroc(torch.cat([msp(logits), msp(ood_logits)]), is_ood)
    assert saved["hydra"]["metrics"]["ood"]["ood"]["auroc"] == pytest.approx(auroc)
    report = (root / "report" / "report.md").read_text()
    assert "| single |" in report and "| hydra |" in report
    # the comparison DESIGN asks for: a paired interval of the difference, not two means side by side
    pair = json.loads((root / "report" / "metrics.json").read_text())["differences"]["pairs"][0]
    assert pair["rows"] == ["hydra", "single"] and "Each model against the first, single:" in report
    nll = {name: saved[name]["metrics"]["id"]["nll"] for name in ("hydra", "single")}
    assert pair["nll"]["point"] == pytest.approx(nll["hydra"] - nll["single"], abs=1e-9)
    assert pair["nll"]["low"] <= pair["nll"]["point"] <= pair["nll"]["high"] and "- hydra vs single: NLL" in report
    for name in ("reliability.png", "ood_scores.png"):
        assert (root / "report" / name).stat().st_size > 0


def test_evaluate_resumes_and_measures_again_a_model_recorded_without_its_logits(flow, tmp_path):
    """A stopped evaluate resumes from results.json; a model recorded there whose logits file is missing (a stop
    between the two saves) is measured again, where the report would crash loading it."""
    root, d, f, runs = flow
    out = tmp_path / "report"
    shutil.copytree(d["report"], out)
    (out / RECORD).write_text(json.dumps(json.loads((out / RECORD).read_text()) | {"finished": False}))
    recorded = json.loads((out / "results.json").read_text())
    (out / "results.json").write_text(json.dumps({name: r | {"read": "back"} for name, r in recorded.items()}))
    (out / "logits" / "hydra.pt").unlink()
    models = ["--model", f"single={d['single']}", "--model", f"hydra={d['hydra']}"]
    hydra_ens("evaluate", *models, "--data", f["test"], "--text-column", "review", "--ood", f["ood"], "--out", str(out))
    results = json.loads((out / "metrics.json").read_text())["results"]
    assert results["single"]["read"] == "back" and "read" not in results["hydra"]  # only hydra measured again
    assert (out / "logits" / "hydra.pt").exists() and results["hydra"]["metrics"] == recorded["hydra"]["metrics"]


def test_predict_flags_ood_above_the_threshold_chosen_at_the_stated_tpr(flow):
    root, d, f, runs = flow
    ensemble = he.HydraEnsemble.from_pretrained(f"{d['hydra']}/ensemble")
    id_scores = OOD_SCORES["msp"](collect_member_logits(ensemble, batches(f["val"], ensemble)))
    threshold, accepted = id_threshold(id_scores, 0.95)
    assert accepted >= 0.95 and (id_scores <= threshold).double().mean() >= 0.95
    rows = [json.loads(line) for line in (root / "predictions.jsonl").read_text().splitlines()]
    logits = collect_member_logits(ensemble, batches(f["new"], ensemble, labelled=False))
    probs = he.ensemble_probs(logits)
    assert len(rows) == len(probs) == 4
    for row, p, mi, score in zip(rows, probs, he.mutual_information(logits), OOD_SCORES["msp"](logits)):
        assert row["prediction"] == ensemble.model_config.id2label[int(p.argmax())]
        # printed rounded (the probability to 4 decimals, at most 5e-5 off; MI to 6 digits), from the same logits
        assert row["probability"] == pytest.approx(p.max().item(), abs=5e-5 + CONTRACT)
        assert row["mutual_information"] == pytest.approx(mi.item(), rel=1e-5, abs=CONTRACT)
        assert row["threshold"] == pytest.approx(threshold) and row["ood"] == (score.item() > threshold)
    table = runs["predict"].stdout
    assert f"msp score > {threshold:.4f}" in table and "95.0%" in table
    assert len([line for line in table.splitlines() if line.startswith("line ")]) == 4


def test_a_finished_step_run_again_is_a_no_op(flow):
    root, d, f, runs = flow
    again = hydra_ens("scores", "--model", d["single"], "--data", f["val"], "--out", d["scores"])
    assert "already done" in again.stdout


def test_image_folders_fine_tune_evaluate_and_predict(tmp_path, image_files, image_classifier):
    f = {k: str(v) for k, v in image_files.items()}
    hydra_ens(
        "finetune",
        "--model",
        str(image_classifier),
        "--data",
        f["train"],
        "--epochs",
        "3",
        "--lr",
        "0.05",
        "--batch-size",
        "8",
        "--out",
        str(tmp_path / "vit"),
    )
    hydra_ens(
        "evaluate",
        "--model",
        str(tmp_path / "vit"),
        "--data",
        f["test"],
        "--far",
        f"stripes={f['ood']}",
        "--out",
        str(tmp_path / "report"),
    )
    result = json.loads((tmp_path / "report" / "metrics.json").read_text())["results"]["vit"]["metrics"]
    assert set(result) == {"id", "ood", "far", "all"} and "stripes" in result["ood"]
    tuned = load_classifier(tmp_path / "vit" / "model")
    test = read_encoded(f["test"], *load_preprocessor(tmp_path / "vit" / "model"), tuned.config).batches
    logits, labels = collect_member_logits(tuned, test), torch.cat([b["labels"] for b in test])
    before = collect_member_logits(load_classifier(image_classifier), test)
    accuracy = he.metrics.accuracy(he.ensemble_probs(logits), labels)
    assert result["id"]["acc"] == pytest.approx(accuracy, abs=1e-12) and accuracy >= 0.9  # bright vs dark: learnt
    assert not torch.allclose(logits, before)  # the fine-tuned weights, not the checkpoint it started from
    predicted = hydra_ens("predict", "--model", str(tmp_path / "vit"), "--inputs", f["ood"], "--threshold", "-0.5")
    assert "stripes0.png" in predicted.stdout and "threshold given by --threshold" in predicted.stdout
    assert "6 of 6 inputs flagged" in predicted.stdout  # every score is above -0.5


def test_amp_then_the_usual_steps_give_a_hydra_ensemble_on_the_pruned_base(flow, tmp_path):
    root, d, f, runs = flow
    amp = tmp_path / "amp"
    out = hydra_ens(
        "amp",
        "--model",
        d["single"],
        "--data",
        f["val"],
        "--delta-e",
        "0.05",
        "--recover-data",
        f["train"],
        "--epochs",
        "2",
        "--out",
        str(amp),
    ).stdout
    record = json.loads((amp / "hydra-ens.json").read_text())["results"]
    pruned = he.load_model(amp / "model")
    assert [len(k) for k in he.kept_neurons(pruned).values()] == record["sizes"]
    assert record["parameters"]["after"] < record["parameters"]["before"] and "MLP hidden sizes per block" in out
    assert len(record["recovery"]) == 2 and "MLP neurons kept per layer" in (amp / "model" / "README.md").read_text()
    hydra_ens("scores", "--model", str(amp), "--data", f["val"], "--out", str(tmp_path / "scores"))
    hydra_ens("members", "--model", str(amp), "--scores", str(tmp_path / "scores"), "--out", str(tmp_path / "m"))
    fused = hydra_ens("fuse", "--members", str(tmp_path / "m"), "--out", str(tmp_path / "hydra")).stdout
    assert "exact by construction" in fused
    ensemble = he.HydraEnsemble.from_pretrained(tmp_path / "hydra" / "ensemble")
    members = [he.load_model(tmp_path / "m" / f"member{i}") for i in range(3)]
    assert all(he.kept_neurons(m) == he.kept_neurons(pruned) for m in members)
    assert he.fusion_deviation(ensemble, members, batches(f["val"], ensemble))["logits"] <= CONTRACT


def test_distill_writes_a_hydra_student_with_one_head_per_member_and_a_kd_student(flow, tmp_path):
    root, d, f, runs = flow
    out = tmp_path / "student"
    run = hydra_ens(
        "distill",
        "--teacher", f"{d['hydra']}/ensemble",
        "--model", f"{d['single']}/model",
        "--data", f["train"],
        "--val", f["val"],
        "--epochs", "2",
        "--lr", "1e-3",
        "--out", str(out),
    )  # fmt: skip
    assert "teacher: 3 members" in run.stdout and "hydra: 3 head(s)" in run.stdout and "kd: 1 head(s)" in run.stdout
    hydra, kd = he.HydraEnsemble.from_pretrained(out / "hydra"), he.HydraEnsemble.from_pretrained(out / "kd")
    assert (hydra.num_members, kd.num_members) == (3, 1) and hydra.trunk == hydra.num_layers - 1  # --head-layers 1
    assert all((out / name / "README.md").is_file() for name in ("hydra", "kd"))  # their model cards
    test = batches(f["test"], hydra, "review")
    logits = collect_member_logits(hydra, test)
    assert logits.shape[1:] == (3, 3) and (logits[:, 0] - logits[:, 1]).abs().max() > 0  # heads trained apart
    evaluated = hydra_ens("evaluate", "--model", str(out / "hydra"), "--data", f["test"], "--text-column", "review",
                          "--out", str(tmp_path / "report"))  # fmt: skip
    assert evaluated.returncode == 0
    teacher, model = f"{d['hydra']}/ensemble", f"{d['single']}/model"
    bad = hydra_ens("distill", "--teacher", teacher, "--model", model, "--data", f["train"],
                    "--temperature", "0", "--out", str(tmp_path / "bad"), check=False)  # fmt: skip
    assert bad.returncode == 2 and "--temperature must be > 0" in bad.stderr
