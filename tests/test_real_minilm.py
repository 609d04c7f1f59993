"""Contracts 2 and 3 on the real packaged all-MiniLM-L6-v2 (6 layers x 12 heads) with real sentences, and the
documented AMP -> Hydra path."""

import copy
import re
from pathlib import Path

import pytest
import torch
from conftest import SENTENCES, index_order, output, perturb
from tolerances import CONTRACT

import hydra_ensembles as he
import hydra_ensembles.training as training
from hydra_ensembles.training import TEXT_RECIPE

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def batch(minilm_tokenizer):
    return dict(minilm_tokenizer(SENTENCES, padding=True, return_tensors="pt"))  # padded: lengths differ


def test_contract2_pruned_minilm_equals_ablated(minilm_classifier, batch):
    plan = {0: [0, 5, 11], 2: list(range(12)), 3: [1], 5: list(range(11))}
    with he.ablate_heads(minilm_classifier, plan):
        ablated = output(minilm_classifier, batch)
    pruned = he.prune_heads(copy.deepcopy(minilm_classifier), plan)
    assert (output(pruned, batch) - ablated).abs().max().item() <= CONTRACT
    assert he.count_parameters(pruned) < he.count_parameters(minilm_classifier)


def test_contract3_fused_minilm_members_equal_members_run_one_by_one(minilm_classifier, batch):
    scores = he.taylor_head_scores(minilm_classifier, [batch | {"labels": torch.arange(8) % 3}], progress=False)
    assert scores.shape == (6, 12) and (scores > 0).all()
    head_maps = he.sample_members(scores, num_members=3, budget=[2, 4, 6, 8, 10, 11], seed=0)
    members = [perturb(m, scale=0.01, seed=i) for i, m in enumerate(he.build_members(minilm_classifier, head_maps))]
    ensemble = he.HydraEnsemble.fuse(members, mlp="stack")
    expected = torch.stack([output(m, batch) for m in members], dim=1)
    with torch.no_grad():
        got = ensemble(**batch).member_logits
    assert (got - expected).abs().max().item() <= CONTRACT


def test_minilm_encoder_fuses_and_reloads(minilm_path, batch, tmp_path):
    import transformers as T

    encoder = T.AutoModel.from_pretrained(minilm_path).eval()
    head_maps = he.sample_members(
        torch.rand(6, 12, generator=torch.Generator().manual_seed(0)), num_members=2, budget=3
    )
    ensemble = he.HydraEnsemble.fuse(he.build_members(encoder, head_maps))
    ensemble.save_pretrained(tmp_path / "hydra")
    with torch.no_grad():
        assert torch.equal(
            he.HydraEnsemble.from_pretrained(tmp_path / "hydra")(**batch).member_pooled, ensemble(**batch).member_pooled
        )


def test_fast_circuit_equals_reference_on_minilm(minilm_classifier, batch):
    id_batches = [{k: v[:6] for k, v in batch.items()} | {"labels": torch.tensor([0, 1, 2, 0, 1, 2])}]
    ood_batches = [{k: v[6:] for k, v in batch.items()}]
    reference = he.extract_circuit(
        minilm_classifier, id_batches, ood_batches, "avg", 2, method="reference", progress=False
    )
    fast = he.extract_circuit(minilm_classifier, id_batches, ood_batches, "avg", 2, progress=False)
    assert reference.removed != index_order(minilm_classifier)[:2]  # the heads decided it, not index order
    assert fast.removed == reference.removed
    # S is made of counts (accuracy, ranked ID/OOD pairs): the same counts give the same S up to float64 division
    assert fast.scores == pytest.approx(reference.scores, abs=1e-12)


def test_docs_amp_python_path_runs_on_minilm(minilm_classifier, minilm_tokenizer):
    """docs/amp.md's Python path (AMP -> recovery -> sequential Taylor -> members -> fine-tune -> merged fusion)
    runs as written on the real MiniLM, and its ensemble is cheaper than three of the unpruned members."""
    text = (Path(__file__).parents[1] / "docs" / "amp.md").read_text()
    code = re.search(r"## An ensemble on a pruned base: the Python path\s+```python\n(.*?)```", text, re.S).group(1)
    labels = torch.tensor([0, 1, 2, 0, 0, 2, 2, 1])
    batches = [
        dict(minilm_tokenizer(SENTENCES[i : i + 4], padding=True, return_tensors="pt"), labels=labels[i : i + 4])
        for i in (0, 4)
    ]
    namespace = {
        "model": copy.deepcopy(minilm_classifier),
        "pruning_batches": batches,
        "train_batches": batches,
        "calibration_batches": batches,
        "member_recipe": TEXT_RECIPE.with_(epochs=1, lr=1e-4, freeze_embeddings=True, patience=None),
        "probe": {k: v for k, v in batches[0].items() if k != "labels"},
    }
    recovery = training.AMP_RECOVERY
    training.AMP_RECOVERY = recovery.with_(epochs=1)  # the snippet's recipe, one epoch here
    try:
        exec(compile(code, "docs/amp.md", "exec"), namespace)
    finally:
        training.AMP_RECOVERY = recovery
    ensemble, record = namespace["ensemble"], namespace["record"]
    assert record.sizes == [len(k) for k in he.kept_neurons(namespace["pruned"]).values()]
    assert ensemble(**namespace["probe"]).member_logits.shape == (4, 3, 3)
    probe = namespace["probe"]
    assert he.count_flops(ensemble, probe) < 3 * 0.75 * he.count_flops(minilm_classifier, probe)
