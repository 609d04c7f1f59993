"""Adaptive MLP pruning (paper 002): neuron importance against the formula, the binary search, Algorithm 1."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import MODELS, at_trained_scale, make_inputs, output
from tolerances import CONTRACT, U32, reordered_sum

import hydra_ensembles as he
from hydra_ensembles import training
from hydra_ensembles.adapters import get_adapter
from hydra_ensembles.importance.neurons import (
    Entering,
    binary_search_size,
    criterion_value,
    from_layer,
    layer_inputs,
)

SHORTCUT = 1e-6  # the shortcut's criterion against the full forward pass's (measured: equal, bit for bit)
# A wrong shortcut must land outside the tolerance with a gap of one tolerance, so that neither check can pass
# in the other's place (measured: a wrong shortcut moves it by 7.7e-6 to 0.18 at a trained scale)
DEFECT = 2 * SHORTCUT


def _data(seeds=(1, 2)):
    return [make_inputs("bert", seed=s) | {"labels": torch.tensor([0, 1, 2, 1])} for s in seeds]


def test_neuron_scores_follow_eq_4():
    """I_k = |sum_n h_k dC/dh_k| per sequence = |sum_j W2[j, k] dC/dW2[j, k]| with C that sequence's loss (h_k
    feeds W2's column k), averaged over the sequences: computed here one example at a time from weight gradients,
    an independent path."""
    model, data = MODELS["bert"](), _data()
    got = he.neuron_scores(model, data, loss="cross_entropy", progress=False)
    work = copy.deepcopy(model).eval()
    batch = {k: torch.cat([b[k] for b in data]) for k in data[0]}
    weights = [layer.output.dense.weight for layer in work.bert.encoder.layer]  # W2, (d, F)
    examples = len(batch["labels"])
    expected = [torch.zeros(w.shape[1], dtype=torch.float64) for w in weights]
    bound = [0.0 for _ in weights]
    for i in range(examples):
        inputs = {k: v[i : i + 1] for k, v in batch.items() if k != "labels"}
        loss = F.cross_entropy(work(**inputs).logits, batch["labels"][i : i + 1])
        for layer, (w, g) in enumerate(zip(weights, torch.autograd.grad(loss, weights))):
            expected[layer] += (w * g).sum(dim=0).abs().double() / examples
            bound[layer] = max(bound[layer], (w * g).abs().sum(dim=0).max().item() / examples)
    differs_from_the_whole_set_sum = False
    for layer in range(len(weights)):
        # two orders of summing 10 tokens x 32 outputs of float32 products, for each of 8 examples
        tol = examples * reordered_sum(10 * 32, bound[layer], U32)
        assert (got[layer].double() - expected[layer]).abs().max().item() <= tol + 1e-12
        whole_set = _whole_set(work, batch, layer)
        differs_from_the_whole_set_sum |= bool((got[layer] - whole_set).abs().max() > 0.1 * got[layer].max())
    assert differs_from_the_whole_set_sum  # the absolute value is taken per sequence, not once over the set


def _whole_set(model, batch, layer: int) -> torch.Tensor:
    """|sum over every token of every example of h dC/dh|: the absolute value taken once, over the whole set."""
    loss = F.cross_entropy(model(**{k: v for k, v in batch.items() if k != "labels"}).logits, batch["labels"])
    weight = model.bert.encoder.layer[layer].output.dense.weight
    return (weight * torch.autograd.grad(loss, weight)[0]).sum(dim=0).abs()


def test_binary_search_finds_the_smallest_size_under_the_threshold():
    entropy = lambda size: 1.0 / size  # noqa: E731 (monotone: a wider MLP is less uncertain)
    for delta in (0.01, 0.05, 0.3):
        size, value = binary_search_size(entropy, 1536, reference=1 / 1536, delta=delta, t_max=None)
        smallest = min(m for m in range(1, 1537) if entropy(m) - 1 / 1536 < delta)
        assert (size, value) == (smallest, entropy(smallest))
    # the paper's t_max = 6 halvings of [0, 1536]: 768, 384, 192, 96, 48, 24 -> accepted down to 96 here
    tried = []
    binary_search_size(lambda m: tried.append(m) or entropy(m), 1536, 1 / 1536, 0.01, t_max=6)
    assert tried == [768, 384, 192, 96, 48, 72]
    assert binary_search_size(entropy, 10, reference=0.0, delta=1e-9) == (10, 0.0)  # nothing accepted


def test_adaptive_pruning_keeps_the_most_important_neurons_within_the_threshold():
    model, data = MODELS["bert"](), _data()
    with torch.no_grad():
        model.classifier.weight.mul_(50.0)  # a confident model, so that entropy rises when neurons go
    scores = he.neuron_scores(model, data, loss="entropy", progress=False)
    # a threshold small enough that the search refuses sizes (at 0.05 every block falls to 1 neuron, and no check
    # below could fail): here [16, 19, 10]
    delta = 1e-4
    pruned, record = he.adaptive_mlp_pruning(model, data, delta, loss="entropy", scores=scores, progress=False)
    assert record.sizes == [len(record.kept[layer]) for layer in range(3)]
    assert any(1 < size < 37 for size in record.sizes)
    for layer, size in enumerate(record.sizes):
        order = torch.argsort(scores[layer], descending=True, stable=True).tolist()
        assert sorted(order[:size]) == record.kept[layer]  # the top-`size` neurons by importance
    reference = record.baseline
    for value in record.entropies:  # each block within delta_e of the entropy accepted before it
        assert value - reference < delta
        reference = value
    assert record.entropies[-1] - record.baseline >= delta  # so each block was held to the one before, not the base
    assert criterion_value(pruned, data, "entropy") == pytest.approx(record.entropies[-1], abs=CONTRACT)
    removed = {layer: [k for k in range(37) if k not in record.kept[layer]] for layer in range(3)}
    with he.ablate_neurons(model, removed):
        zeroed = output(model, make_inputs("bert", seed=9))
    assert (output(pruned, make_inputs("bert", seed=9)) - zeroed).abs().max().item() <= CONTRACT
    assert he.kept_neurons(model) == {layer: list(range(37)) for layer in range(3)}  # the original untouched
    loose, _ = he.adaptive_mlp_pruning(model, data, 10.0, loss="entropy", scores=scores, t_max=None, progress=False)
    assert [len(k) for k in he.kept_neurons(loose).values()] == [1, 1, 1] != record.sizes
    for bad, match in (
        ({"delta_e": 0.0}, "delta_e must be a finite number > 0"),
        ({"delta_e": float("nan")}, "delta_e must be a finite number > 0"),  # would accept no size: prune nothing
        ({"delta_e": float("inf")}, "delta_e must be a finite number > 0"),
        ({"t_max": 0}, "t_max must be >= 1"),
        ({"temperature": 0.0}, "temperature must be a finite number > 0"),
    ):
        args = {"delta_e": 0.05} | bad
        with pytest.raises(ValueError, match=match):
            he.adaptive_mlp_pruning(model, data, args.pop("delta_e"), progress=False, **args)


def test_recovery_distils_the_pruned_model_towards_the_unpruned_one_with_the_shared_loop():
    teacher, data = MODELS["bert"](), _data((1, 2, 3, 4))
    student = he.prune_neurons(copy.deepcopy(teacher), {0: range(34), 1: range(34), 2: range(34)})
    with torch.no_grad():  # far from the teacher (pruning a random tiny model changes it little)
        for p in student.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    loss = training.FeatureMSE(teacher, training.last_hidden_states)

    def gap() -> float:
        with torch.no_grad():
            return sum(
                loss(training.last_hidden_states(student, {k: v for k, v in b.items() if k != "labels"}), b)
                for b in data
            ).item()

    before = gap()
    training.recover(student, teacher, data, training.AMP_RECOVERY.with_(epochs=15, lr=1e-3), progress=False)
    assert gap() < 0.5 * before
    assert student.training_history[-1]["loss"] < student.training_history[0]["loss"]


def test_similarity_criterion_reads_the_cls_token_of_a_classifier():
    """loss="similarity" (Eq. 5-7) is the similarity entropy of the last layer's [CLS] features, even for a
    classifier: computed here by hand from the backbone's output, and its importance follows Eq. 4 as above."""
    model, data = MODELS["bert"](), _data()
    cls = torch.cat([model.bert(**{k: v for k, v in b.items() if k != "labels"}).last_hidden_state[:, 0] for b in data])
    z = F.normalize(cls.double(), dim=-1)
    expected = []
    for part in z.split(4):  # batch by batch, as the criterion is a per-batch mean
        p = (part @ part.T * 15).softmax(dim=-1)
        expected.append(-(p * p.log()).sum(dim=-1).mean().item())
    assert criterion_value(model.eval(), data, "similarity") == pytest.approx(sum(expected) / 2, abs=1e-5)
    scores = he.neuron_scores(model, data, loss="similarity", progress=False)
    labelled = he.neuron_scores(model, data, loss="cross_entropy", progress=False)
    assert [s.shape for s in scores] == [s.shape for s in labelled] and all((s >= 0).all() for s in scores)
    assert not all(torch.allclose(a, b) for a, b in zip(scores, labelled))  # another criterion, other scores
    assert he.taylor_head_scores(model, data, loss="similarity", progress=False).isfinite().all()


def test_uniform_width_baselines_keep_the_top_neurons_of_their_ranking():
    from hydra_ensembles.importance import (
        magnitude_neuron_scores,
        prune_to_sizes,
        random_neuron_scores,
        uniform_sizes,
    )

    model, inputs = MODELS["bert"](), make_inputs("bert", seed=9)
    magnitude = magnitude_neuron_scores(model)
    block = model.bert.encoder.layer[1]
    k = 5  # row k of W1, its bias, column k of W2
    by_hand = torch.cat([block.intermediate.dense.weight[k], block.intermediate.dense.bias[k : k + 1]])
    by_hand = torch.cat([by_hand, block.output.dense.weight[:, k]]).norm().item()
    assert magnitude[1][k].item() == pytest.approx(by_hand, rel=1e-6)
    assert uniform_sizes(model, 50) == [17, 17, 16] and sum(uniform_sizes(model, 111)) == 111
    with pytest.raises(ValueError, match="between 3"):
        uniform_sizes(model, 2)
    for scores in (magnitude, random_neuron_scores(model, seed=1)):
        pruned = prune_to_sizes(model, scores, [17, 17, 16])
        kept = he.kept_neurons(pruned)
        assert [len(kept[layer]) for layer in range(3)] == [17, 17, 16]
        removed = {}
        for layer in range(3):
            order = torch.argsort(scores[layer], descending=True, stable=True).tolist()
            assert kept[layer] == sorted(order[: len(kept[layer])])
            removed[layer] = order[len(kept[layer]) :]
        with he.ablate_neurons(model, removed):
            zeroed = output(model, inputs)
        assert (output(pruned, inputs) - zeroed).abs().max().item() <= CONTRACT
    assert not torch.equal(random_neuron_scores(model, 1)[0], random_neuron_scores(model, 2)[0])
    with pytest.raises(ValueError, match="between 1 and its width"):
        prune_to_sizes(model, magnitude, [0, 17, 16])


def test_searching_from_the_cached_states_entering_a_block_equals_the_full_forward_pass(family):
    """Contract: the search's shortcut (blocks 0..l-1 skipped, their output computed once) gives the criterion
    of the full model, for every family and block, with neurons of blocks >= l turned off. At a trained model's
    scale, where a shortcut that ran block l twice, or forgot the neurons turned off, moves the criterion by more
    than `DEFECT` (at HF's init it moves by less than the tolerance in half the families)."""
    model = at_trained_scale(family).eval()
    data = [make_inputs(family, seed=s) for s in (1, 2)]
    adapter = get_adapter(model)
    # the similarity entropy reads the first token, which CLIP's causal text tower keeps constant (refused)
    loss = "entropy" if adapter.is_classifier(model) or adapter.causal else "similarity"
    widths = [len(k) for k in he.kept_neurons(model).values()]
    g = torch.Generator().manual_seed(0)
    for layer in range(1, len(widths)):
        off = {b: torch.randperm(widths[b], generator=g)[: widths[b] // 2].tolist() for b in range(layer, len(widths))}
        with he.ablate_neurons(model, off):
            full = criterion_value(model, data, loss)
            entering = layer_inputs(model, data, layer)
            below = [adapter.layers(model)[i] for i in range(layer)]
            calls: list[int] = []
            hooks = [block.register_forward_hook(lambda *_, calls=calls: calls.append(1)) for block in below]
            with from_layer(model, entering):
                shortcut = criterion_value(model, data, loss)
            for hook in hooks:
                hook.remove()
            if layer + 1 < len(widths):  # a defect: block l's output entering block l, which then runs twice
                with from_layer(model, Entering(layer, layer_inputs(model, data, layer + 1).states, entering.tuples)):
                    assert abs(criterion_value(model, data, loss) - full) >= DEFECT, (family, layer)
        assert shortcut == pytest.approx(full, abs=SHORTCUT), (family, layer)
        assert not calls  # the blocks below were skipped
        assert abs(criterion_value(model, data, loss) - full) >= DEFECT, (family, layer)  # neurons back on
    assert [len(k) for k in he.kept_neurons(model).values()] == widths  # blocks restored, nothing pruned


def test_the_similarity_criterion_is_refused_where_the_first_token_sees_only_itself():
    model = MODELS["clip_text"]()
    data = [make_inputs("clip_text", seed=s) for s in (1, 2)]
    with pytest.raises(ValueError, match="causal text tower .* Use loss='entropy'"):
        criterion_value(model, data, "similarity")
    with pytest.raises(ValueError, match="causal text tower"):
        he.neuron_scores(model, data, loss="similarity", progress=False)
    assert criterion_value(model, data, "entropy") > 0  # the pooled output (end-of-text token) it points to


def test_adaptive_pruning_with_and_without_the_shortcut_agree():
    model, data = MODELS["bert"](), _data()
    with torch.no_grad():
        model.classifier.weight.mul_(50.0)
    scores = he.neuron_scores(model, data, loss="entropy", progress=False)
    runs = [
        he.adaptive_mlp_pruning(model, data, 1e-4, loss="entropy", scores=scores, reuse_prefix=r, progress=False)[1]
        for r in (True, False)
    ]
    assert any(1 < size < 37 for size in runs[0].sizes)  # sizes the search had to decide
    assert runs[0].sizes == runs[1].sizes and runs[0].kept == runs[1].kept
    assert runs[0].entropies == pytest.approx(runs[1].entropies, abs=1e-6)


def test_auto_loss_is_cross_entropy_with_labels_and_entropy_without():
    """Neuron importance and the criterion share Taylor importance's "auto" rule."""
    model = MODELS["bert"]()
    labelled = [make_inputs("bert", seed=s) | {"labels": torch.tensor([0, 1, 2, 1])} for s in (1, 2)]
    unlabelled = [{k: v for k, v in batch.items() if k != "labels"} for batch in labelled]
    for batches, loss in ((labelled, "cross_entropy"), (unlabelled, "entropy")):
        auto, named = (he.neuron_scores(model, batches, loss=name, progress=False) for name in ("auto", loss))
        assert all(torch.equal(a, n) for a, n in zip(auto, named))
        assert criterion_value(model, batches, "auto") == criterion_value(model, batches, loss)
    assert criterion_value(model, labelled, "cross_entropy") != criterion_value(model, labelled, "entropy")
