"""`hydra_ensembles.inference.prepare`: bf16 and torch.compile as `predict`, `evaluate` and the benchmark run them.

The compiled tests (marked `compile`: deselect with -m "not compile") compile tiny models with inductor, some
tens of seconds on 2 loaded cores; everything else runs eager.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import transformers as T
from conftest import LAYERS, MODELS, at_trained_scale, make_inputs, perturb, random_head_maps, scaled_as_trained

import hydra_ensembles as he
from hydra_ensembles import inference, precision
from hydra_ensembles.cli import main
from hydra_ensembles.evaluation.scores import collect_scores
from hydra_ensembles.fusion import layer as fusion_layer
from hydra_ensembles.inference import Prepared, prepare
from hydra_ensembles.outputs import member_logits_of
from hydra_ensembles.precision import cpu_flags

# bf16 keeps 8 significant bits: rounding to it moves a value by at most u = 2^-8 of itself (round to nearest).
UNIT_ROUNDOFF = 2.0**-8


def fused(name: str) -> he.HydraEnsemble:
    """A tiny ensemble of 3 members with uneven heads (ragged layers), fine-tuned apart (stacked MLPs)."""
    base = at_trained_scale(name)
    members = [perturb(m, seed=i) for i, m in enumerate(he.build_members(base, random_head_maps(3, min_heads=1)))]
    return he.HydraEnsemble.fuse(members, mlp="stack")


def logits(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    """Member logits (B, M, C) in fp32, of a prepared predictor or not."""
    with torch.inference_mode():
        return member_logits_of(model(**inputs)).float()


def bf16_bound(layers: int) -> float:
    """The largest error of bf16-autocast logits relative to the fp32 logits' largest magnitude, to first order.

    Autocast runs the matrix products in bf16: each rounds its two operands and its output to 8 bits (3 roundings,
    each a relative error of at most u; the fp32 accumulation adds ~k 2^-24 for k terms, negligible beside them).
    A layer has 6 on the path (q/k/v, QK^T, softmax(.)V, W_o, two MLP matrices), and the head 2 (pooler, classifier):
    n = 6L + 2 products, 3n roundings. Layer norms and softmax run in fp32 and do not amplify a relative error to
    first order, and residual connections add errors, so the logits move by at most 3n u of their magnitude.
    """
    return 3 * (6 * layers + 2) * UNIT_ROUNDOFF


# ---- eager ----


def test_fp32_eager_is_the_predictor_itself_in_eval_mode():
    model = fused("bert").train()
    assert prepare(model) is model and not model.training
    assert inference.describe(model) == "fp32, eager"


def test_an_unknown_precision_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"precision must be one of \['bf16', 'fp32'\], got 'fp16'"):
        prepare(fused("bert"), "fp16")


@pytest.mark.parametrize("name", ["bert", "vit"])
def test_bf16_stays_within_the_derived_bound_and_moves_the_logits(name, monkeypatch):
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: True)
    model, inputs = fused(name), make_inputs(name)
    reference = logits(model, inputs)
    prepared = prepare(model, "bf16")
    assert isinstance(prepared, Prepared) and inference.describe(prepared) == "bf16, eager"
    norms = _norm_dtypes(monkeypatch)
    error = (logits(prepared, inputs) - reference).abs().max().item() / reference.abs().max().item()
    bound = bf16_bound(LAYERS)
    assert 0 < error < bound / 4, (error, bound)  # > 0: bf16 ran; a quarter of the bound: a first-order margin
    # autocast, not a bf16 copy (which would pass the bound too: 0.007 against 0.059): the norms, which the bound
    # assumes exact, read fp32 inputs and weights and return fp32
    assert norms == {(torch.float32, torch.float32, torch.float32)}, norms
    assert torch.equal(logits(model, inputs), reference)  # the predictor itself is left in fp32


def _norm_dtypes(monkeypatch) -> set[tuple[torch.dtype, ...]]:
    """Filled, as the fused engine runs, with each layer norm's (input, weight, output) dtypes."""
    seen, norm = set(), fusion_layer.grouped_layer_norm

    def recorded(x, weight, bias, eps):
        normed = norm(x, weight, bias, eps)
        seen.add((x.dtype, weight.dtype, normed.dtype))
        return normed

    monkeypatch.setattr(fusion_layer, "grouped_layer_norm", recorded)
    return seen


def test_every_predictor_hands_back_fp32_logits_under_bf16(monkeypatch):
    """An HF head under autocast returns bf16 logits, the fused engine fp32: bf16 logits tie far more often (max
    logit, energy), so rows compared in one table must share a precision."""
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: True)
    single, inputs = MODELS["bert"](seed=0).eval(), make_inputs("bert")
    with torch.inference_mode():
        assert prepare(single, "bf16")(**inputs).logits.dtype == torch.float32
        assert member_logits_of(prepare(fused("bert"), "bf16")(**inputs)).dtype == torch.float32


def test_bf16_on_a_cpu_without_bf16_instructions_warns_that_it_is_slow(monkeypatch):
    model = fused("bert")
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: False)
    with pytest.warns(RuntimeWarning, match="bf16 inference on this CPU will be slow"):
        prepare(model, "bf16")
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare(model, "bf16")  # native: no warning
        prepare(model, "fp32")


def test_bf16_training_on_a_cpu_without_bf16_instructions_warns_that_it_is_slow(monkeypatch):
    """Emulated bf16 matrix products take several times fp32's: a user training in bf16 there should know."""
    model, batches = MODELS["bert"](seed=0), [make_inputs("bert") | {"labels": torch.tensor([0, 1, 2, 1])}]
    config = he.training.TEXT_RECIPE.with_(epochs=1, precision="bf16")
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: False)
    with pytest.warns(RuntimeWarning, match="bf16 training on this CPU will be slow") as caught:
        he.training.finetune(model, batches, config, progress=False)
    assert sum("bf16 training" in str(w.message) for w in caught) == 1  # once a run, not once a step
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        he.training.finetune(model, batches, config, progress=False)
        he.training.finetune(model, batches, config.with_(precision="fp32"), progress=False)


def test_a_feature_score_of_a_prepared_model_without_detectors_says_how_to_fit_them(monkeypatch):
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: True)
    prepared = prepare(fused("bert"), "bf16")
    with pytest.raises(ValueError, match="fit them with"):
        collect_scores(prepared, [make_inputs("bert")], "mds")


def test_cpu_flags_read_x86_and_arm_cpuinfo(tmp_path):
    x86, arm = tmp_path / "x86", tmp_path / "arm"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx512f avx512_bf16\n")
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpu_flags(x86) == {"fpu", "avx512f", "avx512_bf16"}
    assert cpu_flags(arm) == {"fp", "asimd", "bf16"}
    assert cpu_flags(tmp_path / "absent") == set()


# ---- compiled ----


@pytest.mark.compile
@pytest.mark.parametrize("name", ["bert", "vit"])
def test_compiled_fused_engine_has_no_graph_break_and_equals_eager(name):
    torch._dynamo.reset()
    model = fused(name)
    inputs = make_inputs(name)
    with torch.inference_mode():
        explained = torch._dynamo.explain(model)(**inputs)
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    prepared = prepare(model, compile=True)
    assert inference.describe(prepared) == "fp32, compiled"
    first, second = make_inputs(name, batch=4), make_inputs(name, batch=3)
    torch.testing.assert_close(logits(prepared, first), logits(model, first), atol=1e-5, rtol=0)
    with torch._dynamo.config.patch(error_on_recompile=True):  # another batch size: the same dynamic graph
        torch.testing.assert_close(logits(prepared, second), logits(model, second), atol=1e-5, rtol=0)


NUMBERS = ("probability", "mutual_information", "ood_score")  # predict's numbers per input


@pytest.mark.compile
def test_predict_compiled_gives_the_same_predictions(tmp_path, capsys):
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    torch.manual_seed(0)
    config = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    base = T.BertForSequenceClassification(T.BertConfig(vocab_size=len(vocab), num_labels=3, **config)).eval()
    base = scaled_as_trained(base, 5.0)  # at HF's init every input gets the same class and probability
    maps = [{0: [0, 1], 1: [2]}, {0: [3], 1: [0, 1, 2]}]
    model_dir = tmp_path / "hydra"
    he.HydraEnsemble.fuse(he.build_members(base, maps)).save_pretrained(model_dir)
    T.BertTokenizer(vocab={token: i for i, token in enumerate(vocab)}).save_pretrained(model_dir)
    texts = tmp_path / "new.txt"
    texts.write_text("\n".join(" ".join(words[(i + j) % 6] for j in range(2 + i % 5)) for i in range(7)))
    common = ["predict", "--model", str(model_dir), "--inputs", str(texts), "--threshold", "0.5", "--format"]
    rows = {}
    for flags in ([], ["--compile"]):
        assert main([*common, "jsonl", "--device", "cpu", "--batch-size", "3", "--quiet", *flags]) == 0
        run = capsys.readouterr()
        rows[tuple(flags)] = [json.loads(line) for line in run.out.splitlines()]
        assert f"run: fp32, {'compiled' if flags else 'eager'}" in run.err
    eager, compiled = rows[()], rows[("--compile",)]
    assert len(eager) == len(compiled) == 7 and len({row["probability"] for row in eager}) == 7  # inputs differ
    for a, b in zip(eager, compiled):  # the same classes and flags; the numbers, written to 6 digits, within 1e-5
        assert {k: a[k] for k in ("input", "prediction", "ood")} == {k: b[k] for k in ("input", "prediction", "ood")}
        assert [a[k] for k in NUMBERS] == pytest.approx([b[k] for k in NUMBERS], rel=1e-5, abs=1e-6)
