"""Zero-shot two-tower ensembles on tiny random `CLIPModel` configs: the fused ensemble equals its members run one
by one (both towers pruned, unequal heads per member, or one tower only), class embeddings follow their
definition, and the predictor saves, reloads and plugs into temperature scaling and evaluation. Prompts go through a
real CLIPTokenizer over a tiny vocabulary (conftest.build_clip_tokenizer)."""

import pytest
import torch
import torch.nn.functional as F
from conftest import HEADS, LAYERS, random_head_maps, tiny_clip
from tolerances import CONTRACT

from hydra_ensembles.evaluation.report import classification_metrics
from hydra_ensembles.outputs import collect_member_logits
from hydra_ensembles.predictors import (
    Calibrated,
    TemperatureScaling,
    TwoTowerModel,
    ZeroShotEnsemble,
    class_prompts,
    load_predictor,
    save_predictor,
    zero_shot_ensemble,
)
from hydra_ensembles.predictors.clip_zero_shot import class_embeddings, member_logits_one_by_one

CLASSES = ["cat", "dog", "small red car", "tree"]
TEMPLATES = ["a photo of a {}.", "a drawing of the {}"]


def _tokens(tokenizer, texts):
    return tokenizer(texts, padding=True, truncation=True, return_tensors="pt")


def _images(seed=1, batch=5):
    return {"pixel_values": torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(seed))}


@pytest.mark.parametrize("towers", ["both", "image", "text"])
def test_fused_zero_shot_ensemble_equals_its_members_one_by_one(towers, clip_tokenizer):
    two_tower = TwoTowerModel.from_clip(tiny_clip())
    image_maps = random_head_maps(3, seed=4, min_heads=1) if towers in ("both", "image") else None
    text_maps = random_head_maps(3, seed=5, min_heads=1) if towers in ("both", "text") else None
    tokenizer = clip_tokenizer
    ensemble = zero_shot_ensemble(two_tower, CLASSES, tokenizer, TEMPLATES, image_maps, text_maps)
    inputs = _images()
    with torch.no_grad():
        fused = ensemble(**inputs).member_logits
        prompts = [_tokens(tokenizer, class_prompts(CLASSES, TEMPLATES))]
        expected = member_logits_one_by_one(two_tower, inputs, prompts, len(CLASSES), image_maps, text_maps)
    assert fused.shape == (5, 3, 4) and ensemble.num_members == 3
    assert (fused - expected).abs().max().item() <= CONTRACT * two_tower.logit_scale
    assert (expected[:, 0] - expected[:, 1]).abs().max().item() > 100 * CONTRACT  # members differ


def test_class_embeddings_and_logits_follow_the_definition(clip_tokenizer):
    """Single model, by hand: CLIPModel's own image and text features, normalised, averaged over templates."""
    clip = tiny_clip()
    two_tower, tokenizer = TwoTowerModel.from_clip(clip), clip_tokenizer
    single = zero_shot_ensemble(two_tower, CLASSES, tokenizer, TEMPLATES)
    inputs = _images()
    with torch.no_grad():
        text = clip.get_text_features(**_tokens(tokenizer, class_prompts(CLASSES, TEMPLATES))).pooler_output  # (C*T, P)
        per_class = F.normalize(F.normalize(text, dim=-1).view(4, 2, -1).mean(dim=1), dim=-1)
        image = F.normalize(clip.get_image_features(**inputs).pooler_output, dim=-1)
        expected = clip.logit_scale.exp() * image @ per_class.T
        got = single(**inputs).member_logits
    assert got.shape == (5, 1, 4)
    assert (got[:, 0] - expected).abs().max().item() <= CONTRACT * 100
    assert class_prompts(["a", "b"], ["x {}", "y {}"]) == ["x a", "y a", "x b", "y b"]
    with pytest.raises(ValueError, match="'\\{\\}'"):
        class_prompts(["a"], ["no slot"])
    with pytest.raises(ValueError, match="same number of members"):
        zero_shot_ensemble(two_tower, CLASSES, tokenizer, TEMPLATES, random_head_maps(3), random_head_maps(2))
    with pytest.raises(ValueError, match="do not split evenly"):
        class_embeddings(two_tower.text, [_tokens(tokenizer, ["a", "b", "c"])], 2)


def test_zero_shot_ensemble_saves_reloads_and_works_with_the_evaluation_stack(tmp_path, clip_tokenizer):
    two_tower, tokenizer = TwoTowerModel.from_clip(tiny_clip()), clip_tokenizer
    ensemble = zero_shot_ensemble(
        two_tower, CLASSES, tokenizer, TEMPLATES, random_head_maps(3, seed=2, min_heads=1), random_head_maps(3, seed=3)
    )
    save_predictor(ensemble, tmp_path / "zs")
    loaded = load_predictor(tmp_path / "zs")
    assert isinstance(loaded, ZeroShotEnsemble) and loaded.classes == CLASSES and loaded.templates == TEMPLATES
    inputs = _images()
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).member_logits, ensemble(**inputs).member_logits)
    batches = [_images(seed=s) | {"labels": torch.tensor([0, 1, 2, 3, 0])} for s in (1, 2)]
    logits = collect_member_logits(Calibrated(loaded, TemperatureScaling(2.0)), batches)
    assert logits.shape == (10, 3, 4)
    metrics = classification_metrics(logits, torch.cat([b["labels"] for b in batches]))
    assert 0 <= metrics["acc"] <= 1 and metrics["nll"] > 0
    loaded.set_classes(["cat", "tree"], ["{}"], tokenizer)  # other classes: recomputed once per member
    with torch.no_grad():
        assert loaded(**inputs).member_logits.shape == (5, 3, 2)
    two_tower.save_pretrained(tmp_path / "tt")
    again = TwoTowerModel.from_pretrained(tmp_path / "tt")
    assert again.logit_scale == pytest.approx(two_tower.logit_scale)
    with torch.no_grad():
        assert torch.equal(again.image(**inputs), two_tower.image(**inputs))
    tiny_clip().save_pretrained(tmp_path / "clip")
    assert TwoTowerModel.from_pretrained(tmp_path / "clip").logit_scale == pytest.approx(two_tower.logit_scale)


# ---- joint circuits over both towers (§D.3) ----


def _circuit_data(tokenizer):
    labelled = [_images(seed=s, batch=6) | {"labels": torch.tensor([0, 1, 2, 3, 1, 2])} for s in (11, 12)]
    ood = [{"pixel_values": 3 * torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(13))}]
    return labelled, ood, [_tokens(tokenizer, class_prompts(CLASSES, TEMPLATES))]


def _literal_score(clip, tower, layer, head, removed, labelled, ood, prompts, criterion):
    """S with `removed` + one head off, from CLIPModel itself: ablate in the tower, recompute everything."""
    from hydra_ensembles import ablate_heads

    heads = {"image": {}, "text": {}}
    for t, lay, h in [*removed, (tower, layer, head)]:
        heads[t].setdefault(lay, []).append(h)
    with torch.no_grad(), ablate_heads(clip.vision_model, heads["image"]), ablate_heads(clip.text_model, heads["text"]):
        text = F.normalize(clip.get_text_features(**prompts[0]).pooler_output, dim=-1)
        classes = F.normalize(text.view(len(CLASSES), len(TEMPLATES), -1).mean(dim=1), dim=-1)
        images = [F.normalize(clip.get_image_features(**b).pooler_output, dim=-1) for b in labelled + ood]
        logits = clip.logit_scale.exp() * torch.cat(images) @ classes.T
    labels = torch.cat([b["labels"] for b in labelled])
    return criterion(logits[: len(labels)], labels, logits[len(labels) :])


def test_joint_fast_circuit_equals_the_reference_and_the_literal_definition(tmp_path, clip_tokenizer):
    from hydra_ensembles.importance import JointCircuit, extract_joint_circuit
    from hydra_ensembles.importance.circuit import CRITERIA

    clip, tokenizer = tiny_clip(seed=3), clip_tokenizer
    two_tower = TwoTowerModel.from_clip(clip)
    labelled, ood, prompts = _circuit_data(tokenizer)
    args = (two_tower, labelled, ood, prompts, len(CLASSES), "avg", 6)
    fast = extract_joint_circuit(*args, batch_size=4, progress=False, state_path=tmp_path / "state.json")
    reference = extract_joint_circuit(*args, method="reference", progress=False)
    assert fast.removed == reference.removed and fast.search == "exact"
    assert fast.scores == pytest.approx(reference.scores, abs=1e-6)
    assert {t for t, _, _ in fast.removed} <= {"image", "text"} and len(set(fast.removed)) == 6
    # every step's winner scores what the literal definition gives (CLIPModel, ablated, end to end)
    for step, (tower, layer, head) in enumerate(fast.removed):
        literal = _literal_score(clip, tower, layer, head, fast.removed[:step], labelled, ood, prompts, CRITERIA["avg"])
        assert fast.scores[step] == pytest.approx(literal, abs=1e-6)
    fast.save(tmp_path / "joint.json")
    assert JointCircuit.load(tmp_path / "joint.json") == fast
    resumed = extract_joint_circuit(*args, batch_size=4, progress=False, state_path=tmp_path / "state.json")
    assert resumed.removed == fast.removed
    maps = fast.head_maps(2)
    assert sum(len(h) for t in maps.values() for h in t.values()) == 2 * LAYERS * HEADS - 2
    image_only = extract_joint_circuit(*args[:-1], 3, towers=("image",), progress=False)
    assert {t for t, _, _ in image_only.removed} == {"image"}
    with pytest.raises(ValueError, match="budget must be between 1 and 11"):
        extract_joint_circuit(*args[:-1], 12, towers=("image",), progress=False)
    with pytest.raises(ValueError, match="method must be one of"):
        extract_joint_circuit(*args, method="screen", progress=False)


def test_members_sampled_from_a_joint_circuit_fuse_per_tower_and_equal_the_members_one_by_one(clip_tokenizer):
    from hydra_ensembles import sample_members
    from hydra_ensembles.importance import extract_joint_circuit

    two_tower, tokenizer = TwoTowerModel.from_clip(tiny_clip(seed=3)), clip_tokenizer
    labelled, ood, prompts = _circuit_data(tokenizer)
    circuit = extract_joint_circuit(two_tower, labelled, ood, prompts, len(CLASSES), "avg", 8, progress=False)
    members = sample_members(circuit, num_members=3, budget=4, pool=8, seed=0)
    assert all(set(m) == {"image", "text"} for m in members) and len({str(m) for m in members}) == 3
    image_maps, text_maps = [m["image"] for m in members], [m["text"] for m in members]
    ensemble = zero_shot_ensemble(two_tower, CLASSES, tokenizer, TEMPLATES, image_maps, text_maps)
    inputs = _images(seed=7)
    with torch.no_grad():
        fused = ensemble(**inputs).member_logits
        expected = member_logits_one_by_one(two_tower, inputs, prompts, len(CLASSES), image_maps, text_maps)
    assert (fused - expected).abs().max().item() <= CONTRACT * two_tower.logit_scale


def test_taylor_scores_of_the_image_tower_read_the_zero_shot_logits(clip_tokenizer):
    """Taylor on the vision tower only (§C.3): the loss is the zero-shot cross-entropy; checked against the
    saliency |w dL/dw| of CLIPModel's own vision q/k/v weights, head by head."""
    from hydra_ensembles import taylor_head_scores

    clip, tokenizer = tiny_clip(seed=5), clip_tokenizer
    single = zero_shot_ensemble(TwoTowerModel.from_clip(clip), CLASSES, tokenizer, TEMPLATES)
    data = [_images(seed=s, batch=6) | {"labels": torch.tensor([0, 1, 2, 3, 1, 2])} for s in (21, 22)]
    got = taylor_head_scores(clip.vision_model, data, loss="cross_entropy", readout=single.readout(), progress=False)
    classes = single.embeddings[0].detach()
    layers = clip.vision_model.encoder.layers
    weights = [
        p
        for layer in layers
        for p in (layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight)
    ]
    total = 0
    for batch in data:
        image = F.normalize(clip.get_image_features(pixel_values=batch["pixel_values"]).pooler_output, dim=-1)
        loss = F.cross_entropy(clip.logit_scale.exp().detach() * image @ classes.T, batch["labels"]) * 6 / 12
        grads = torch.autograd.grad(loss, weights)
        total = grads if total == 0 else [a + b for a, b in zip(total, grads)]
    for layer in range(LAYERS):
        per_proj = [(weights[3 * layer + i] * total[3 * layer + i]).abs().view(HEADS, -1).mean(dim=1) for i in range(3)]
        expected = torch.stack(per_proj).mean(dim=0)
        assert torch.allclose(got[layer], expected, rtol=1e-4, atol=1e-9)


def test_class_embeddings_are_computed_without_dropout_whatever_the_mode(clip_tokenizer):
    """A tower left in training mode (a wrapper's evaluation restores the mode it found) must not put dropout
    noise into the class embeddings: they are computed in eval mode and the mode is given back."""
    two_tower, tokenizer = TwoTowerModel.from_clip(tiny_clip(seed=2, dropout=0.5)), clip_tokenizer
    reference = zero_shot_ensemble(two_tower.eval(), CLASSES, tokenizer, TEMPLATES).embeddings
    for _ in range(2):
        two_tower.train()
        assert torch.equal(zero_shot_ensemble(two_tower, CLASSES, tokenizer, TEMPLATES).embeddings, reference)
    two_tower.train()
    prompts = [_tokens(tokenizer, class_prompts(CLASSES, TEMPLATES))]
    assert torch.equal(class_embeddings(two_tower.text, prompts, len(CLASSES)), reference)
    assert two_tower.text.training  # given back in the mode it came in
