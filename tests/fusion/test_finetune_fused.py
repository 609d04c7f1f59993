"""Fine-tuning after fusing (paper 000, Fig. 1: prune, fuse, then fine-tune the fused ensemble as one module).

The exactness statement: pruned members that were not fine-tuned fuse exactly (contract 4), and a fused ensemble
trained as one module stays exactly an ensemble of HF members, the ones `unfuse` rebuilds from it (per-member
heads and classifiers, one shared MLP, norms and embeddings): fused == rebuilt members run one by one, within
the contracts' bound, after training moved every member by far more than that bound.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
import transformers as T
from conftest import at_trained_scale, fused_output, killed_at_step, make_inputs, output, random_head_maps
from tolerances import CONTRACT, DEFECT

import hydra_ensembles as he
from hydra_ensembles import training as ft
from hydra_ensembles.predictors import load_predictor

CLASSIFIERS = ["bert", "roberta", "mpnet", "distilbert", "vit", "deit_teacher", "dinov2", "modernbert", "deberta"]
CLASSIFIERS += ["deberta_c2p"]  # DeBERTa-v2's own position projections, trained in the fused layer
ONE_STEP = ft.TEXT_RECIPE.with_(epochs=1, lr=1e-2, warmup=0.0, patience=None)


def _labelled(name: str, seed: int = 7, batches: int = 1) -> list[dict]:
    classes = 5 if name in ("vit", "deit_teacher", "dinov2") else 3
    return [make_inputs(name, seed=seed + i) | {"labels": torch.arange(4) % classes} for i in range(batches)]


def _pruned_and_fused(name: str, members: int = 3):
    pruned = he.build_members(at_trained_scale(name), random_head_maps(members, seed=5))
    return pruned, he.HydraEnsemble.fuse(pruned, mlp="average")


def _one_by_one(members, inputs) -> torch.Tensor:
    return torch.stack([output(m, inputs) for m in members], dim=1)  # (B, M, C)


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_a_fused_ensemble_fine_tuned_as_one_module_equals_the_members_rebuilt_from_it(name):
    pruned, ensemble = _pruned_and_fused(name)
    inputs = make_inputs(name, seed=3)
    assert ensemble.averaged == []  # pruned, not fine-tuned: they share MLPs, norms, embeddings exactly
    assert (fused_output(ensemble, inputs) - _one_by_one(pruned, inputs)).abs().max() <= CONTRACT  # contract 4
    before = fused_output(ensemble, inputs)
    ft.finetune_fused(ensemble, _labelled(name), ONE_STEP, progress=False)
    rebuilt = ensemble.unfuse(pruned)
    after = fused_output(ensemble, inputs)
    assert (after - _one_by_one(rebuilt, inputs)).abs().max() <= CONTRACT
    assert (after - before).abs().max() > DEFECT  # training moved the members
    mlps = [_mlp_in(m, layer=1) for m in rebuilt]
    assert all(torch.equal(w, mlps[0]) for w in mlps)  # one merged MLP, trained for all members
    assert not torch.equal(mlps[0], _mlp_in(pruned[0], layer=1))


def _mlp_in(model, layer: int) -> torch.Tensor:
    adapter = he.get_adapter(model)
    return adapter.block(adapter.layers(model)[layer]).mlp_in.weight


def test_the_summed_loss_is_each_members_own_cross_entropy_summed():
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(6, 3, 4, generator=g), torch.tensor([0, 1, 2, 3, 0, 1])
    for smoothing in (0.0, 0.1):
        summed = ft.CrossEntropy(smoothing)(logits, {"labels": labels})
        apart = sum(F.cross_entropy(logits[:, m], labels, label_smoothing=smoothing) for m in range(3))
        torch.testing.assert_close(summed, apart, atol=1e-6, rtol=0)
    one_model = 3 * F.cross_entropy(logits.mean(1), labels)  # what a loss on the mean logits would give
    assert (ft.CrossEntropy()(logits, {"labels": labels}) - one_model).abs() > 0.1


def test_gradients_reach_every_members_heads_and_classifier_and_the_shared_mlp_as_the_sum_of_theirs():
    _, ensemble = _pruned_and_fused("bert")
    batch = _labelled("bert")[0]
    ensemble.train()
    ft.CrossEntropy()(ensemble(**batch).member_logits, batch).backward()
    total = {name: p.grad.clone() for name, p in ensemble.named_parameters() if p.grad is not None}
    apart = {name: torch.zeros_like(g) for name, g in total.items()}
    for m in range(ensemble.num_members):  # member m's own cross-entropy alone
        ensemble.zero_grad()
        F.cross_entropy(ensemble(**batch).member_logits[:, m], batch["labels"]).backward()
        for name, p in ensemble.named_parameters():
            if p.grad is not None:
                apart[name] += p.grad
    for name in total:
        torch.testing.assert_close(total[name], apart[name], atol=1e-6, rtol=1e-5)
    for index, layer in enumerate(ensemble.layers):
        assert (
            total[f"layers.{index}.mlp_in_weight"].shape[0] == 1
            and total[f"layers.{index}.mlp_in_weight"].abs().max() > 0
        )
        grads = {name: total[f"layers.{index}.{name}"] for name in ("qkv_weight", "qkv_bias", "o_weight", "o_bias")}
        for m, count in enumerate(layer.head_counts):
            assert count == 0 or layer.member_attention(m, grads).qkv_weight.abs().max() > 0  # its own heads
    heads = [name for name, _ in ensemble.outer.member.named_parameters()]
    assert any("classifier" in name for name in heads)
    for name in heads:  # the pooler and classifier of every member
        grad = total[f"outer.member.{name}"]
        assert all(grad[m].abs().max() > 0 for m in range(ensemble.num_members)), name


def test_validation_keeps_the_best_epoch_and_the_saved_ensemble_reloads_equal(tmp_path):
    _, ensemble = _pruned_and_fused("vit")
    config = ft.IMAGE_RECIPE.with_(epochs=3, lr=0.05, augment="crop_flip")
    ft.finetune_fused(
        ensemble, _labelled("vit", batches=2), config, val_loader=_labelled("vit", seed=30), progress=False
    )
    history = ensemble.training_history
    assert len(history) == 3 and all("val_nll" in record for record in history)
    best = min(range(3), key=lambda i: history[i]["val_nll"]) + 1
    assert ensemble.kept_epoch == best
    ensemble.save_pretrained(tmp_path / "ensemble")
    inputs = make_inputs("vit", seed=3)
    assert torch.equal(fused_output(load_predictor(tmp_path / "ensemble"), inputs), fused_output(ensemble, inputs))


def test_a_run_resumed_in_another_layout_is_refused_with_the_fix(tmp_path):
    """A fused ensemble's layout follows its device: a run started on a GPU (padded) and resumed on a CPU (ragged)
    finds tensors of other shapes in its checkpoint, and is told why and what to do."""
    data, two_epochs = _labelled("bert", batches=3), ONE_STEP.with_(epochs=2)
    _, ensemble = _pruned_and_fused("bert")
    assert any(layer.ragged for layer in ensemble.layers)
    with killed_at_step(4):  # in epoch 2: epoch 1 is checkpointed
        ft.finetune_fused(ensemble.set_layout("padded"), data, two_epochs, checkpoint_dir=tmp_path, progress=False)
    _, fresh = _pruned_and_fused("bert")
    with pytest.raises(ValueError, match="lays out its attention by device"):
        ft.finetune_fused(fresh, data, two_epochs, checkpoint_dir=tmp_path, progress=False)
    resumed = ft.finetune_fused(fresh.set_layout("padded"), data, two_epochs, checkpoint_dir=tmp_path, progress=False)
    assert [record["epoch"] for record in resumed.training_history] == [1, 2]  # laid out as it was: resumed


def test_refusals():
    pruned, ensemble = _pruned_and_fused("bert")
    with pytest.raises(ValueError, match="fused classifier ensemble"):
        ft.finetune_fused(pruned[0], _labelled("bert"), ONE_STEP, progress=False)
    with pytest.raises(ValueError, match="templates"):
        ensemble.unfuse(pruned[:2])
    with pytest.raises(ValueError, match="other heads"):
        ensemble.unfuse(pruned[::-1])
    encoders = [T.BertModel(m.config) for m in pruned]  # no classifier: a KeyError in the copy before
    with pytest.raises(ValueError, match="template 0 is a BertModel; the ensemble's members are BertForSequence"):
        ensemble.unfuse(encoders)
    with pytest.raises(ValueError, match="template 0 is torch.bfloat16 and the ensemble torch.float32"):
        ensemble.unfuse([copy.deepcopy(m).bfloat16() for m in pruned])  # copying would round the weights


@pytest.mark.parametrize("name", ["bert", "dinov2"])
def test_the_recipe_freezes_a_fused_ensembles_embeddings_and_earlier_layers_as_of_one_hf_model(name):
    _, ensemble = _pruned_and_fused(name)
    where = {n: ensemble.locate(n) for n, _ in ensemble.named_parameters()}
    assert {part for part, _ in where.values()} == {"embeddings", "layer", "head"}
    assert all(("embeddings" in n) == (part == "embeddings") for n, (part, _) in where.items())
    before = {n: p.detach().clone() for n, p in ensemble.named_parameters()}
    ft.finetune_fused(ensemble, _labelled(name), ONE_STEP.with_(train_last=1), progress=False)
    last = ensemble.num_layers - 1
    for n, p in ensemble.named_parameters():
        part, layer = where[n]
        trained = part == "head" or (part == "layer" and layer == last)
        assert torch.equal(p, before[n]) != trained, (n, part, layer)  # trained ones moved, frozen ones did not


@pytest.mark.parametrize("name", ["bert", "dinov2"])
def test_weight_decay_moves_a_fused_ensemble_as_it_moves_each_member_alone(name):
    """AdamW decays matrices, not biases, norms or layer scales; stacked per member in a fused ensemble those are
    2-D tensors, which `no_weight_decay` names. With a zero loss one step is the decay alone: unfused, the fused
    ensemble's step equals each member's own step (a decayed bias or norm would differ by a factor 1 - lr * wd)."""
    pruned = he.build_members(at_trained_scale(name), random_head_maps(2, seed=5))  # biases not zero
    fused = he.HydraEnsemble.fuse(pruned, mlp="stack")
    templates = [copy.deepcopy(member) for member in pruned]  # untrained: a tensor unfuse misses would show
    recipe = ONE_STEP.with_(weight_decay=0.5, clip=None)
    nothing = lambda output, batch: 0 * (getattr(output, "member_logits", output)).sum()  # noqa: E731
    ft.train(fused, _labelled(name), recipe, loss=nothing, progress=False)
    alone = [ft.train(member, _labelled(name), recipe, loss=nothing, progress=False) for member in pruned]
    for rebuilt, member in zip(fused.unfuse(templates), alone, strict=True):
        expected = member.state_dict()
        for key, tensor in rebuilt.state_dict().items():
            torch.testing.assert_close(tensor, expected[key], rtol=0, atol=CONTRACT, msg=key)
