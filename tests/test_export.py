"""Export: one traced graph of a fused ensemble (or one pruned model) reproduces PyTorch's member logits at batch
sizes and sequence lengths other than the example's, in `torch.export` and in ONNX Runtime (CPU).

The parity bound. ONNX Runtime and PyTorch compute the same float32 sums with other kernels, so in another order
(its own GEMM blocking, fused layer norm and softmax), which is the situation `tolerances.CONTRACT` is derived
for: rounding of reordered dot products grows like sqrt(K) u per reduction and as a random walk over the
<= 6 reductions of each of <= 6 layers, for the tiny configs (K <= 37, activations O(1)) and for MiniLM (K <= 1536,
weights O(0.1)) alike: ~2.4e-6, bounded by CONTRACT = 1e-5. Measured max |difference| (this machine's CPU): tiny
fused BERT 1.5e-7, ViT 3.3e-7, MPNet 2.4e-7, DINOv2 3.0e-7, CLIP-text 7.7e-7, one CLIP-text model 1.2e-6; the fused
packaged MiniLM 6.9e-8 (its untrained classifier's logits are <= 0.05): a margin of 8x or more. A defect (a member's
heads or classifier given to another, padding attended) moves the logits by >= `tolerances.DEFECT`, which the
ensemble tests assert of their members' outputs (MiniLM's members differ by 0.03).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers as T
from conftest import IMAGE, SENTENCES, SIZES, at_trained_scale, make_inputs, perturb, random_head_maps
from tolerances import CONTRACT, DEFECT

import hydra_ensembles as he
from hydra_ensembles.cli import main
from hydra_ensembles.export import ONE_FILE_BYTES, export_onnx, export_program, weight_bytes
from hydra_ensembles.predictors import Calibrated, TemperatureScaling, save_predictor

ort = pytest.importorskip("onnxruntime", reason="pip install '.[export]'")
pytest.importorskip("onnxscript", reason="pip install '.[export]'")

# a post-norm text family (padding masks), a pre-norm image family, and MPNet (a float score bias for a mask)
FAMILIES = ["bert", "vit", "mpnet"]


def shapes(family: str) -> list[dict[str, torch.Tensor]]:
    """Inputs of three batch sizes, one of them 1 (and, for text, two sequence lengths), none the example's
    (4 x 10)."""
    first, second = make_inputs(family, batch=2, seed=2), make_inputs(family, batch=5, seed=3)
    if "input_ids" in second:
        second = {k: v[:, :7] for k, v in second.items()}  # rows 2 (4 tokens) and 3 (9) stay padded
    one = {k: v[1:2] for k, v in first.items()}  # a graph traced at B = 4 must not have fixed B > 1 anywhere
    return [first, second, one]


@pytest.fixture(scope="module", params=FAMILIES)
def fused(request) -> tuple[str, he.HydraEnsemble]:
    """3 members with unequal heads (one layer with no head in some member), fine-tuned apart, stacked MLPs."""
    family = request.param
    members = he.build_members(at_trained_scale(family), random_head_maps(3, seed=1))
    members = [perturb(m, scale=0.05, seed=i) for i, m in enumerate(members)]
    return family, he.HydraEnsemble.fuse(members, mlp="stack")


def eager(ensemble: he.HydraEnsemble, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        out = ensemble(**inputs)
    return out.member_logits if out.member_logits is not None else out.member_pooled  # (B, M, C) or (B, M, D)


def onnx_outputs(path, inputs: dict) -> torch.Tensor:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {k: v.numpy() for k, v in inputs.items()})[0])


def test_onnx_runtime_reproduces_fused_ensemble_at_other_batch_sizes_and_lengths(fused, tmp_path):
    family, ensemble = fused
    path = ensemble.export_onnx(tmp_path / "fused.onnx", make_inputs(family) | {"labels": torch.zeros(4)})
    for inputs in shapes(family):
        expected = eager(ensemble, inputs)
        got = onnx_outputs(path, inputs)
        assert got.shape == expected.shape == (len(next(iter(inputs.values()))), 3, expected.shape[-1])
        assert (got - expected).abs().max() <= CONTRACT
        members_differ = (expected[:, 1:] - expected[:, :1]).abs().max()
        assert members_differ >= DEFECT  # a graph that ran one member three times would fail the bound


def test_torch_export_of_fused_module_matches_eager(fused):
    family, ensemble = fused
    program = export_program(ensemble, make_inputs(family))
    assert isinstance(program, torch.export.ExportedProgram)
    for inputs in shapes(family):
        with torch.no_grad():
            got = program.module()(inputs)
        assert (got - eager(ensemble, inputs)).abs().max() <= CONTRACT


@pytest.mark.parametrize(
    "family",
    [
        "deberta",
        "modernbert",
        "electra",
        "siglip_classifier",
        "distilbert",
        "deit_teacher",
        "dinov2",
        "dinov2_registers",
        "dinov3_encoder",
        "clip_text",
        "clip_vision",
        "roberta",
        "xlm_roberta",
    ],
)
def test_onnx_runtime_reproduces_the_newer_families(family, tmp_path):
    """Every family beyond the fixture's BERT / ViT / MPNet: DeBERTa-v3 (disentangled position scores: a gather over
    distance buckets), ModernBERT (rotary, local and global layers), ELECTRA (an embedding projection), SigLIP's
    image classifier, DistilBERT, DeiT, DINOv2 (layer scale; with registers), DINOv3 (2-D rotary), both CLIP
    towers (encoders: member_pooled), RoBERTa and XLM-RoBERTa (position ids after the padding id) in ONNX Runtime,
    ragged members, at shapes other than the example's (ModernBERT's local window is wider than these inputs: its masks
    are checked in the family's contract tests)."""
    members = he.build_members(at_trained_scale(family), random_head_maps(3, seed=1))
    ensemble = he.HydraEnsemble.fuse([perturb(m, scale=0.05, seed=i) for i, m in enumerate(members)], mlp="stack")
    path = ensemble.export_onnx(tmp_path / "fused.onnx", make_inputs(family))
    for inputs in shapes(family):
        assert (onnx_outputs(path, inputs) - eager(ensemble, inputs)).abs().max() <= CONTRACT


def test_onnx_runtime_reproduces_one_pruned_model(tmp_path):
    model = he.build_members(at_trained_scale("bert"), random_head_maps(1, seed=2, min_heads=1))[0]
    path = export_onnx(model, tmp_path / "member.onnx", make_inputs("bert"))
    for inputs in shapes("bert"):
        with torch.no_grad():
            expected = model(**inputs).logits[:, None]  # (B, 1, C)
        assert (onnx_outputs(path, inputs) - expected).abs().max() <= CONTRACT


def test_export_gives_every_module_its_own_mode_back():
    """Exporting switched the model to eval for good: a model exported halfway through training went on without
    its dropout. Each submodule's mode is given back, a frozen part held in eval mode included."""
    model = at_trained_scale("bert").train()
    model.bert.embeddings.eval()
    modes = {name: sub.training for name, sub in model.named_modules()}
    export_program(model, make_inputs("bert"))
    assert {name: sub.training for name, sub in model.named_modules()} == modes


def test_export_refuses_a_wrapper_and_a_one_row_example(tmp_path):
    model = he.build_members(at_trained_scale("bert"), random_head_maps(1, seed=2, min_heads=1))[0]
    with pytest.raises(ValueError, match="cannot export a Calibrated"):
        export_onnx(Calibrated(model, TemperatureScaling(1.5)), tmp_path / "x.onnx", make_inputs("bert"))
    with pytest.raises(ValueError, match="at least 2 inputs"):
        export_program(model, make_inputs("bert", batch=1))
    assert not list(tmp_path.iterdir())  # nothing half-written


@pytest.mark.parametrize("channels", [3, 1])
def test_cli_export_of_a_saved_image_classifier_runs_in_onnx_runtime(tmp_path, channels):
    """The example is made by the saved image processor (two images it resizes to the model's 16 x 16), with the
    model's channels: a greyscale model was traced on RGB examples and refused."""
    torch.manual_seed(0)
    model = T.ViTForImageClassification(T.ViTConfig(**(IMAGE | {"num_channels": channels}), **SIZES, num_labels=5))
    model = he.build_members(model, random_head_maps(1, seed=2, min_heads=1))[0].eval()
    save_predictor(model, tmp_path / "vit")
    mean, std = [0.5] * channels, [0.5] * channels
    T.ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=mean, image_std=std).save_pretrained(
        tmp_path / "vit"
    )
    assert main(["export", str(tmp_path / "vit"), str(tmp_path / "vit.onnx")]) == 0
    inputs = {"pixel_values": torch.randn(3, channels, 16, 16)}
    with torch.no_grad():
        expected = model(**inputs).logits[:, None]
    assert (onnx_outputs(tmp_path / "vit.onnx", inputs) - expected).abs().max() <= CONTRACT


@pytest.mark.real_model
def test_onnx_runtime_reproduces_fused_minilm(minilm_classifier, minilm_tokenizer, tmp_path):
    """The packaged all-MiniLM-L6-v2, 3 members of 9 of 12 heads per layer, exported through `hydra-ens export`
    (its example made by the saved tokenizer), run at two batch sizes and lengths."""
    head_maps = [{layer: [h for h in range(12) if h % 4 != m] for layer in range(6)} for m in range(3)]
    ensemble = he.HydraEnsemble.fuse(he.build_members(minilm_classifier, head_maps))
    save_predictor(ensemble, tmp_path / "hydra")
    minilm_tokenizer.save_pretrained(tmp_path / "hydra")
    assert main(["export", str(tmp_path / "hydra"), str(tmp_path / "hydra.onnx")]) == 0
    for batch in (SENTENCES, SENTENCES[2:5]):
        inputs = dict(minilm_tokenizer(batch, padding=True, return_tensors="pt"))
        expected = eager(ensemble, inputs)
        assert (onnx_outputs(tmp_path / "hydra.onnx", inputs) - expected).abs().max() <= CONTRACT
        assert (expected[:, 1:] - expected[:, :1]).abs().max() >= DEFECT  # the members tell apart


def test_a_failed_export_keeps_the_previous_one_and_a_one_file_export_drops_stale_weights(tmp_path, monkeypatch):
    """An export that dies mid-write leaves the previous files as they were and no partial folder; a one-file
    export removes the `.data` weights an earlier, larger export left beside it (they would not load together)."""
    model = he.build_members(at_trained_scale("bert"), random_head_maps(1, seed=2, min_heads=1))[0]
    path = tmp_path / "member.onnx"
    path.write_bytes(b"the previous graph")
    path.with_name("member.onnx.data").write_bytes(b"the previous weights")

    def dies(program, f, **kwargs):
        Path(f).write_bytes(b"half a graph")
        raise RuntimeError("killed mid-export")

    with monkeypatch.context() as patch:
        patch.setattr(torch.onnx, "export", dies)
        with pytest.raises(RuntimeError, match="killed mid-export"):
            export_onnx(model, path, make_inputs("bert"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["member.onnx", "member.onnx.data"]
    assert path.read_bytes() == b"the previous graph"
    export_onnx(model, path, make_inputs("bert"))
    assert [p.name for p in tmp_path.iterdir()] == ["member.onnx"] and path.read_bytes() != b"the previous graph"


def test_the_one_file_limit_counts_a_tied_weight_once():
    """A tied embedding counted twice could send a model under the limit to two files (and a graph near 2 GiB of
    weights alone to one file, past protobuf's limit: the threshold leaves room for the graph)."""
    tied = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    tied[1].weight = tied[0].weight  # (10, 4) float32: 160 bytes, held once
    assert weight_bytes(tied) == 160 and sum(t.nbytes for t in tied.state_dict().values()) == 320
    assert ONE_FILE_BYTES < 2 * 1024**3
