"""Parameters and FLOPs: contract 5 on a ViT-B/16 configuration (random weights, 1000 classes)."""

import copy
import time

import pytest
import torch
import transformers as T
from conftest import MODELS, make_inputs

import hydra_ensembles as he


def test_vit_b16_cost_by_hand_and_against_the_paper(capsys):
    """Single's parameters and mult-adds are the paper's Table 7 figures; the fused ensemble's parameters are
    counted by hand (116.47M; the paper gives 116.31M, 0.14 % less, and does not say what it leaves out)."""
    torch.manual_seed(0)
    single = T.ViTForImageClassification(T.ViTConfig(image_size=224, patch_size=16, num_labels=1000)).eval()
    assert round(he.count_parameters(single) / 1e6, 2) == 86.57
    maps = he.sample_members(torch.rand(12, 12), num_members=3, budget=4, pool=12, seed=0)  # 8 heads per layer
    members = he.build_members(single, maps)
    ensemble = he.HydraEnsemble.fuse(members)
    fused = he.count_parameters(ensemble)
    # What fusion adds to the single model, by hand: per layer, three members' q/k/v (768 -> 8 x 64, with bias)
    # and W_o (8 x 64 -> 768, with its own bias) in place of one full attention; two more heads (final LayerNorm
    # and 1000-class classifier: each member keeps its own).
    d, kept = 768, 8 * 64
    member_attention = 3 * (d * kept + kept) + kept * d + d
    single_attention = 3 * (d * d + d) + d * d + d
    added = 12 * (3 * member_attention - single_attention) + 2 * (2 * d + d * 1000 + 1000)
    assert fused == he.count_parameters(single) + added  # 116.47M; the paper's Table 7 gives 116.31M (0.14 % less)
    rows = he.cost_table(single, members, ensemble, {"pixel_values": torch.randn(1, 3, 224, 224)})
    with capsys.disabled():
        print("\n" + he.format_cost_table(rows))
    by_name = {row.name: row for row in rows}
    assert by_name["single"].macs == pytest.approx(17.58e9, rel=0.01)  # paper Table 7: 17.58 G mult-adds
    every_token = he.count_flops(ensemble, {"pixel_values": torch.randn(1, 3, 224, 224), "output_hidden_states": True})
    assert every_token / 2 == pytest.approx(46.19e9, rel=0.01)  # paper: 46.19 G, last layer over all tokens
    assert by_name["fused Hydra Ensemble"].macs < every_token / 2  # by default the last layer computes [CLS] only
    assert by_name["deep ensemble (3 x single)"].parameters == 3 * he.count_parameters(single)


def test_flops_count_attention_on_cpu():
    """Without the CPU flash-attention formula, QK^T and AV would be missing from the count."""
    model, inputs = MODELS["vit"](), make_inputs("vit", batch=2)
    projections_only = 2 * 2 * 17 * 3 * (4 * 32 * 32 + 2 * 32 * 37) + 2 * 2 * 16 * 48 * 32 + 2 * 2 * 32 * 5
    attention = 2 * 2 * 3 * 2 * 17 * 17 * 32
    assert he.count_flops(model, inputs) == projections_only + attention


def test_fused_flops_count_only_the_kept_heads():
    """Members with unequal heads per layer run ragged: the fused ensemble computes exactly its members' heads, so
    over every token it costs what its members cost run one by one (BERT: the embeddings are lookups, no FLOPs).
    The padded layout computes the zero-padded heads on top: by hand, each costs its q/k/v/o projections and
    its QK^T and AV products."""
    model, inputs = MODELS["bert"](), make_inputs("bert", batch=2)
    unequal = [{0: [0], 1: [0, 1, 2, 3], 2: [0, 3]}, {0: [1, 2], 1: [0], 2: [0, 2, 3]}]  # no layer alike
    members = he.build_members(model, unequal)
    ensemble = he.HydraEnsemble.fuse(members)
    every_token = {**inputs, "output_hidden_states": True}  # the last layer over all tokens, as a member runs it
    assert he.count_flops(ensemble, every_token) == sum(he.count_flops(m, inputs) for m in members)
    padded = copy.deepcopy(ensemble).set_layout("padded")
    (batch, tokens), d, dh = inputs["input_ids"].shape, 32, 8
    padded_heads = sum(
        2 * max(len(m[layer]) for m in unequal) - sum(len(m[layer]) for m in unequal) for layer in range(3)
    )
    per_head = 2 * batch * tokens * (4 * d * dh + 2 * tokens * dh)
    assert he.count_flops(padded, every_token) - he.count_flops(ensemble, every_token) == padded_heads * per_head
    # the padded heads are zeros, no member's parameters: the same ensemble has as many on every device
    stored = sum(p.numel() for p in padded.parameters()) - sum(p.numel() for p in ensemble.parameters())
    assert stored == padded_heads * dh * (3 * (d + 1) + d)  # q/k/v columns and biases, W_o rows
    assert he.count_parameters(padded) == he.count_parameters(ensemble) == sum(p.numel() for p in ensemble.parameters())


def test_interleaved_latency_rotates_the_order_and_gives_ratios_per_round():
    calls = []
    runs = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    stats = he.cost.interleaved_latency(runs, repeats=3, warmup=1)
    # rotated by one each round, the second cycle of rotations reversed: b follows a, then c, then a...
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "c", "b", "a"]
    for count in (2, 3, 4):  # over 2 cycles each runs first, and after each other, equally often
        calls.clear()
        names = "abcd"[:count]
        he.cost.interleaved_latency({n: (lambda n=n: calls.append(n)) for n in names}, repeats=2 * count, warmup=0)
        rounds = [calls[i : i + count] for i in range(0, len(calls), count)]
        assert sorted(r[0] for r in rounds) == sorted(names * 2)
        pairs = [(r[i], r[i + 1]) for r in rounds for i in range(count - 1)]
        assert all(pairs.count((x, y)) == pairs.count((y, x)) for x in names for y in names if x != y)
    assert stats["a"] == {**stats["a"], "median": 1.0, "min": 1.0, "max": 1.0}  # the reference, to itself
    assert all(s["min"] <= s["median"] <= s["max"] for s in stats.values())
    assert he.cost.format_latency({"median": 1.934, "min": 1.851, "max": 2.02}) == "1.93 (1.85-2.02)"
    with pytest.raises(ValueError, match="repeats >= 1"):
        he.cost.interleaved_latency(runs, repeats=0)


def test_interleaved_latency_shows_its_rounds_when_asked(capsys):
    runs = {"a": lambda: None, "b": lambda: None}
    he.cost.interleaved_latency(runs, repeats=3, warmup=1)
    assert capsys.readouterr().err == ""
    he.cost.interleaved_latency(runs, repeats=3, warmup=1, progress=True)
    bar = capsys.readouterr().err
    assert "timing:" in bar and "0/4 " in bar, bar  # its rounds, the warm-up included (cleared when done)


def test_warmup_rounds_are_left_out_of_the_timings():
    """A first call 100x slower than the others (compilation, caches): with one warm-up round it is not timed."""
    first = {"b": True}

    def slow_first():
        time.sleep(0.2 if first.pop("b", False) else 0.002)

    stats = he.cost.interleaved_latency({"a": lambda: time.sleep(0.002), "b": slow_first}, repeats=3, warmup=1)
    assert stats["b"]["max"] < 10 and stats["b"]["seconds"] < 0.05


def test_counting_flops_leaves_every_submodule_in_its_mode():
    """A wrapper in training mode may hold members in eval mode (a saved predictor's card counts its FLOPs):
    counting must not switch the members' dropout on."""
    wrapper = torch.nn.ModuleDict({"member": MODELS["bert"]()}).train()
    wrapper["member"].eval()
    wrapper.forward = lambda **inputs: wrapper["member"](**inputs)
    he.count_flops(wrapper, make_inputs("bert"))
    assert wrapper.training and not any(module.training for module in wrapper["member"].modules())


def test_stored_parameters_are_found_through_wrappers():
    """A deep ensemble of shared copies says what it stores; a temperature over it must not hide that (counting its
    M full copies), and the temperature's own parameters are added."""
    from hydra_ensembles import predictors as P

    model = MODELS["bert"]()
    deep = P.DeepEnsemble([model, MODELS["bert"](seed=1)], stored_parameters=7)
    calibrated = P.Calibrated(deep, P.TemperatureScaling(2.0))
    own = he.count_parameters(calibrated) - he.count_parameters(deep)  # the temperature's
    assert he.cost.stored_parameters(deep) == 7 and he.cost.stored_parameters(calibrated) == 7 + own
    assert he.cost.stored_parameters(model) == he.count_parameters(model)


def test_a_compiled_module_is_counted_eager_and_stays_compiled():
    """Counting ran a module compiled in place under the FLOP counter: dynamo skipped its frame there, and every
    call after ran eager, so `evaluate --compile` timed an eager model. It is counted eager now, compiled after."""

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.linear(x).relu()

    model = Small().eval()
    eager = he.count_flops(model, {"x": torch.randn(2, 4)})
    model.compile(backend="eager")  # dynamo's tracing alone: what decides whether a call is compiled
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    assert he.count_flops(model, {"x": torch.randn(2, 4)}) == eager == 2 * 2 * 4 * 3
    assert not torch._dynamo.utils.counters["frames"]["total"]  # counting traced nothing
    model(x=torch.randn(2, 4))
    assert torch._dynamo.utils.counters["frames"]["total"] == 1  # the next call is compiled
