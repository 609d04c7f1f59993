"""OBA (Sun et al., 2025), paper 000's unstructured pruning baseline: its score against the exact Hessian written
out, the iterative pruning's count and schedule, and the pruned weights held at zero by the training loop."""

import copy

import pytest
import torch
import torch.nn.functional as F
import transformers as T
from conftest import MODELS, make_inputs
from tolerances import U64, reordered_sum
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from hydra_ensembles.importance.oba import oba_prune, oba_ranking, oba_scores
from hydra_ensembles.pruning.weights import kept_fraction, linear_parameters, mask_weights, zero_weights
from hydra_ensembles.training import TEXT_RECIPE, finetune


def _loader(name="bert", batches=2, batch=4):
    return [make_inputs(name, batch=batch, seed=10 + i) | {"labels": torch.arange(batch) % 3} for i in range(batches)]


def _smallest_bert() -> torch.nn.Module:
    """~1,600 parameters (hidden 8, one layer of two heads): small enough to write its Hessian out."""
    torch.manual_seed(0)
    config = T.BertConfig(
        vocab_size=99, max_position_embeddings=24, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=8, num_labels=3,
    )  # fmt: skip
    with torch.no_grad():  # weights at a trained model's scale, so that curvature is not all in the classifier
        model = T.BertForSequenceClassification(config).double().eval()
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _literal_scores(model, batches):
    """theta_i (H theta)_i with H = d^2 L / d theta^2 written out as a (P, P) matrix, L the mean cross-entropy over
    all examples concatenated, theta every parameter."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    theta = torch.cat([p.detach().flatten() for _, p in model.named_parameters()])
    inputs = {k: torch.cat([b[k] for b in batches]) for k in batches[0] if k != "labels"}
    labels = torch.cat([b["labels"] for b in batches])

    def loss(flat):
        params = dict(zip(names, (piece.view(s) for piece, s in zip(flat.split([s.numel() for s in shapes]), shapes))))
        return F.cross_entropy(functional_call(model, params, kwargs=inputs).logits, labels)

    with sdpa_kernel(SDPBackend.MATH):
        hessian = torch.autograd.functional.hessian(loss, theta)  # (P, P)
    scores = (theta * (hessian @ theta)).split([s.numel() for s in shapes])
    diagonal = (theta * hessian.diagonal() * theta).split([s.numel() for s in shapes])  # OBD's: no cross terms
    eligible = linear_parameters(model)
    by_name = dict(zip(names, zip(scores, diagonal, shapes)))
    return {n: (s.view(shape), d.view(shape)) for n, (s, d, shape) in by_name.items() if n in eligible}, hessian.shape[
        0
    ]


def test_scores_are_theta_times_the_exact_hessian_times_theta():
    model, batches = _smallest_bert(), _loader()
    literal, size = _literal_scores(model, batches)
    got = oba_scores(model, batches, progress=False)
    assert set(got) == set(literal) and size > 1500
    # both in float64, the same sums in another order: each (H theta)_i sums <= P terms per example and layer
    # (the Hessian's row times theta, accumulated over 8 examples x 10 tokens through ~6 reductions); relative to
    # the largest score, the reordered-sum bound of that many terms, times 100 for the cancellation in a signed sum
    scale = max(float(s.abs().max()) for s, _ in literal.values())
    tolerance = 100 * reordered_sum(size * 8 * 10 * 6, scale, U64)
    for name, (expected, _) in literal.items():
        torch.testing.assert_close(got[name], expected, rtol=0, atol=tolerance)
    # the cross terms are what OBA adds to OBD: leaving them out moves the scores far beyond the tolerance
    assert max(float((got[n] - d).abs().max()) for n, (_, d) in literal.items()) > 1e6 * tolerance


def test_scores_ignore_batching():
    model = _smallest_bert()
    batches = _loader(batches=2, batch=4)
    first, second = batches  # unequal sizes (1, 3, 4): each batch must weigh by its examples, not count once
    rebatched = [{k: v[:1] for k, v in first.items()}, {k: v[1:] for k, v in first.items()}, second]
    one, other = oba_scores(model, batches, progress=False), oba_scores(model, rebatched, progress=False)
    for name in one:
        torch.testing.assert_close(other[name], one[name], rtol=1e-9, atol=1e-12)


def test_one_round_removes_the_lowest_ranked_weights():
    model, batches = MODELS["bert"](), _loader()
    ranking = oba_ranking(model, oba_scores(model, batches, progress=False))
    remove = 500
    masks = oba_prune(copy.deepcopy(model), batches, remove, steps=1, progress=False)
    flat_rank = torch.cat([ranking[n].flatten() for n in masks])
    flat_kept = torch.cat([masks[n].flatten() for n in masks])
    assert int((~flat_kept).sum()) == remove
    assert float(flat_rank[~flat_kept].max()) <= float(flat_rank[flat_kept].min())


def test_rounds_remove_exactly_the_budget_and_training_keeps_it_removed():
    model, batches = MODELS["bert"](), _loader(batches=3)
    eligible = sum(p.numel() for p in linear_parameters(model).values())
    remove = eligible // 10
    masks = oba_prune(model, batches, remove, steps=3, progress=False)
    assert sum(int((~m).sum()) for m in masks.values()) == remove
    assert kept_fraction(masks) == pytest.approx(1 - remove / eligible)
    before = {n: p.detach().clone() for n, p in linear_parameters(model).items()}
    for name, p in linear_parameters(model).items():
        assert not p[~masks[name]].any(), name
    finetune(model, batches, TEXT_RECIPE.with_(epochs=2, lr=1e-2, warmup=0.0), progress=False)
    moved = 0
    for name, p in linear_parameters(model).items():
        assert not p[~masks[name]].any(), f"{name}: a pruned weight trained away from zero"
        moved += int((p[masks[name]] != before[name][masks[name]]).sum())
    assert moved > 0.9 * (eligible - remove)  # the kept weights did train


def test_bad_input_is_refused_with_the_fix():
    model, batches = MODELS["bert"](), _loader()
    eligible = sum(p.numel() for p in linear_parameters(model).values())
    with pytest.raises(ValueError, match="remove must be between 1 and"):
        oba_prune(model, batches, eligible, progress=False)
    with pytest.raises(ValueError, match="steps must be at least 1"):
        oba_prune(model, batches, 10, steps=0, progress=False)
    with pytest.raises(ValueError, match="no classification head"):
        oba_scores(MODELS["bert_encoder"](), [make_inputs("bert")], progress=False)
    with pytest.raises(ValueError, match="must be torch.bool of the parameter's shape"):
        mask_weights(model, {"classifier.weight": torch.ones(2, 2, dtype=torch.bool)})
    with pytest.raises(KeyError, match="not a parameter of this model"):
        mask_weights(model, {"nope.weight": torch.ones(2, 2, dtype=torch.bool)})


def test_zeroing_a_weight_that_is_inf_leaves_zero_not_nan():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    with torch.no_grad():
        model[0].weight[0, 0] = float("inf")
    kept = torch.ones(2, 3, dtype=torch.bool)
    kept[0, 0] = False
    zero_weights(model, {"0.weight": kept})
    assert model[0].weight[0, 0].item() == 0.0 and torch.isfinite(model[0].weight).all()
