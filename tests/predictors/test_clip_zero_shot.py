"""Zero-shot two-tower ensembles on tiny random `CLIPModel` and `SiglipModel` configs (conftest.TWO_TOWERS): the
fused ensemble equals its members run one by one (both towers pruned, unequal heads per member, or one tower only),
class embeddings and logits follow their definition (SigLIP's: its logit bias, prompts padded to the maximum
length), and the predictor saves, reloads and plugs into temperature scaling and evaluation. Prompts go through a
real CLIPTokenizer over a tiny vocabulary (conftest.build_clip_tokenizer)."""

import pytest
import torch
import torch.nn.functional as F
from conftest import HEADS, LAYERS, MODELS, TWO_TOWERS, random_head_maps
from tolerances import CONTRACT

from hydra_ensembles.evaluation.report import classification_metrics
from hydra_ensembles.outputs import collect_member_logits
from hydra_ensembles.predictors import (
    Calibrated,
    TemperatureScaling,
    Tower,
    TwoTowerModel,
    ZeroShotEnsemble,
    class_prompts,
    load_predictor,
    save_predictor,
    zero_shot_ensemble,
)
from hydra_ensembles.predictors.clip_zero_shot import class_embeddings, member_logits_one_by_one, prompt_batches

CLASSES = ["cat", "dog", "small red car", "tree"]
TEMPLATES = ["a photo of a {}.", "a drawing of the {}"]


def _tokens(tokenizer, texts):
    return tokenizer(texts, padding=True, truncation=True, return_tensors="pt")


def _prompts(two_tower, tokenizer, classes=CLASSES, templates=TEMPLATES):
    """The class prompts tokenised as the text tower's family needs (SigLIP: padded to the maximum length)."""
    return prompt_batches(tokenizer, classes, templates, two_tower.text)


def _images(seed=1, batch=5):
    return {"pixel_values": torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(seed))}


def _two_tower(family: str) -> TwoTowerModel:
    """A CLIP or SigLIP model's towers, or "dinov3+clip": DINOv3, which transformers gives no classifier, as the
    image tower (with a projection of its own, as in LiT) beside CLIP's text tower."""
    if family != "dinov3+clip":
        return TwoTowerModel.from_clip(TWO_TOWERS[family]())
    text = TwoTowerModel.from_clip(TWO_TOWERS["clip"]()).text
    return TwoTowerModel(Tower(MODELS["dinov3_encoder"]().eval(), torch.nn.Linear(32, 16)), text, logit_scale=20.0)


@pytest.mark.parametrize("family", [*TWO_TOWERS, "dinov3+clip"])
@pytest.mark.parametrize("towers", ["both", "image", "text"])
def test_fused_zero_shot_ensemble_equals_its_members_one_by_one(towers, family, clip_tokenizer):
    two_tower = _two_tower(family)
    image_maps = random_head_maps(3, seed=4, min_heads=1) if towers in ("both", "image") else None
    text_maps = random_head_maps(3, seed=5, min_heads=1) if towers in ("both", "text") else None
    tokenizer = clip_tokenizer
    ensemble = zero_shot_ensemble(two_tower, CLASSES, tokenizer, TEMPLATES, image_maps, text_maps)
    inputs = _images()
    with torch.no_grad():
        fused = ensemble(**inputs).member_logits
        prompts = _prompts(two_tower, tokenizer)
        expected = member_logits_one_by_one(two_tower, inputs, prompts, len(CLASSES), image_maps, text_maps)
    assert fused.shape == (5, 3, 4) and ensemble.num_members == 3
    assert (fused - expected).abs().max().item() <= CONTRACT * two_tower.logit_scale
    assert (expected[:, 0] - expected[:, 1]).abs().max().item() > 100 * CONTRACT  # members differ


@pytest.mark.parametrize("family", TWO_TOWERS)
def test_class_embeddings_and_logits_follow_the_definition(family, clip_tokenizer):
    """Single model, by hand: the HF model's own image and text features, normalised, averaged over templates;
    with one template, the HF model's own `logits_per_image` (SigLIP's logit bias included)."""
    clip = TWO_TOWERS[family]()
    two_tower, tokenizer = TwoTowerModel.from_clip(clip), clip_tokenizer
    single = zero_shot_ensemble(two_tower, CLASSES, tokenizer, TEMPLATES)
    inputs = _images()
    bias = clip.logit_bias if family == "siglip" else 0.0
    with torch.no_grad():
        text = clip.get_text_features(**_prompts(two_tower, tokenizer)[0]).pooler_output  # (C*T, P)
        per_class = F.normalize(F.normalize(text, dim=-1).view(4, 2, -1).mean(dim=1), dim=-1)
        image = F.normalize(clip.get_image_features(**inputs).pooler_output, dim=-1)
        expected = clip.logit_scale.exp() * image @ per_class.T + bias
        got = single(**inputs).member_logits
        one_template = zero_shot_ensemble(two_tower, CLASSES, tokenizer, ["{}"])(**inputs).member_logits[:, 0]
        hf = clip(**_prompts(two_tower, tokenizer, templates=["{}"])[0], **inputs).logits_per_image  # (B, C)
    assert got.shape == (5, 1, 4)
    assert (got[:, 0] - expected).abs().max().item() <= CONTRACT * 100
    assert (one_template - hf).abs().max().item() <= CONTRACT * 100
    assert class_prompts(["a", "b"], ["x {}", "y {}"]) == ["x a", "y a", "x b", "y b"]
    with pytest.raises(ValueError, match="'\\{\\}'"):
        class_prompts(["a"], ["no slot"])
    with pytest.raises(ValueError, match="same number of members"):
        zero_shot_ensemble(two_tower, CLASSES, tokenizer, TEMPLATES, random_head_maps(3), random_head_maps(2))
    one, other = random_head_maps(1, seed=5)[0], random_head_maps(1, seed=6)[0]
    whole_layer_0 = dict(one) | {0: list(range(HEADS))}  # and the same map with layer 0 left out (kept whole)
    same = [whole_layer_0, {layer: heads for layer, heads in whole_layer_0.items() if layer != 0}]
    for image_maps, text_maps in (([one] * 3, [other] * 3), ([one] * 2, None), (same, None)):
        with pytest.raises(ValueError, match="same .image, text. heads: identical members"):
            zero_shot_ensemble(two_tower, CLASSES, tokenizer, TEMPLATES, image_maps, text_maps)
    with pytest.raises(
        ValueError, match=r"names layer\(s\) \[99\], out of range"
    ):  # was dropped silently by the completion
        zero_shot_ensemble(two_tower, CLASSES, tokenizer, TEMPLATES, [one, one | {99: [0]}], None)
    repeated_text = zero_shot_ensemble(two_tower, CLASSES, tokenizer, TEMPLATES, [one, other], [other, other])
    assert repeated_text.num_members == 2  # one tower may repeat a map: the pairs differ
    with pytest.raises(ValueError, match="do not split evenly"):
        class_embeddings(two_tower.text, [_tokens(tokenizer, ["a", "b", "c"])], 2)
    if family == "siglip":  # the prompts' embeddings depend on their padded length: padded as trained, to the max
        assert _prompts(two_tower, tokenizer)[0]["input_ids"].shape[1] == tokenizer.model_max_length


@pytest.mark.parametrize("family", TWO_TOWERS)
def test_zero_shot_ensemble_saves_reloads_and_works_with_the_evaluation_stack(family, tmp_path, clip_tokenizer):
    two_tower, tokenizer = TwoTowerModel.from_clip(TWO_TOWERS[family]()), clip_tokenizer
    ensemble = zero_shot_ensemble(
        two_tower, CLASSES, tokenizer, TEMPLATES, random_head_maps(3, seed=2, min_heads=1), random_head_maps(3, seed=3)
    )
    save_predictor(ensemble, tmp_path / "zs")
    loaded = load_predictor(tmp_path / "zs")
    assert isinstance(loaded, ZeroShotEnsemble) and loaded.classes == CLASSES and loaded.templates == TEMPLATES
    assert loaded.logit_bias == ensemble.logit_bias == two_tower.logit_bias
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
    assert again.logit_scale == pytest.approx(two_tower.logit_scale) and again.logit_bias == two_tower.logit_bias
    with torch.no_grad():
        assert torch.equal(again.image(**inputs), two_tower.image(**inputs))
    TWO_TOWERS[family]().save_pretrained(tmp_path / "hf")
    from_hf = TwoTowerModel.from_pretrained(tmp_path / "hf")
    assert from_hf.logit_scale == pytest.approx(two_tower.logit_scale)
    assert from_hf.logit_bias == pytest.approx(two_tower.logit_bias)


# ---- joint circuits over both towers (§D.3) ----


def _circuit_data(two_tower, tokenizer):
    labelled = [_images(seed=s, batch=6) | {"labels": torch.tensor([0, 1, 2, 3, 1, 2])} for s in (11, 12)]
    ood = [{"pixel_values": 3 * torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(13))}]
    return labelled, ood, _prompts(two_tower, tokenizer)


def _literal_score(clip, tower, layer, head, removed, labelled, ood, prompts, criterion):
    """S with `removed` + one head off, from the HF model itself: ablate in the tower, recompute everything
    (SigLIP's logit bias included: the criteria read softmaxes, which it does not change)."""
    from hydra_ensembles import ablate_heads

    heads = {"image": {}, "text": {}}
    for t, lay, h in [*removed, (tower, layer, head)]:
        heads[t].setdefault(lay, []).append(h)
    with torch.no_grad(), ablate_heads(clip.vision_model, heads["image"]), ablate_heads(clip.text_model, heads["text"]):
        text = F.normalize(clip.get_text_features(**prompts[0]).pooler_output, dim=-1)
        classes = F.normalize(text.view(len(CLASSES), len(TEMPLATES), -1).mean(dim=1), dim=-1)
        images = [F.normalize(clip.get_image_features(**b).pooler_output, dim=-1) for b in labelled + ood]
        logits = clip.logit_scale.exp() * torch.cat(images) @ classes.T + getattr(clip, "logit_bias", 0.0)
    labels = torch.cat([b["labels"] for b in labelled])
    return criterion(logits[: len(labels)], labels, logits[len(labels) :])


@pytest.mark.parametrize("family", TWO_TOWERS)
def test_joint_fast_circuit_equals_the_reference_and_the_literal_definition(family, tmp_path, clip_tokenizer):
    from hydra_ensembles.importance import JointCircuit, extract_joint_circuit
    from hydra_ensembles.importance.circuit import CRITERIA

    clip, tokenizer = TWO_TOWERS[family](seed=3), clip_tokenizer
    two_tower = TwoTowerModel.from_clip(clip)
    labelled, ood, prompts = _circuit_data(two_tower, tokenizer)
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


@pytest.mark.parametrize("family", TWO_TOWERS)
def test_members_sampled_from_a_joint_circuit_fuse_per_tower_and_equal_the_members_one_by_one(family, clip_tokenizer):
    from hydra_ensembles import sample_members
    from hydra_ensembles.importance import extract_joint_circuit

    two_tower, tokenizer = TwoTowerModel.from_clip(TWO_TOWERS[family](seed=3)), clip_tokenizer
    labelled, ood, prompts = _circuit_data(two_tower, tokenizer)
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


@pytest.mark.parametrize("family", TWO_TOWERS)
def test_taylor_scores_of_the_image_tower_read_the_zero_shot_logits(family, clip_tokenizer):
    """Taylor on the vision tower only (§C.3): the loss is the zero-shot cross-entropy; checked against the
    saliency |w dL/dw| of the HF model's own vision q/k/v weights, head by head."""
    from hydra_ensembles import taylor_head_scores

    clip, tokenizer = TWO_TOWERS[family](seed=5), clip_tokenizer
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
        logits = clip.logit_scale.exp().detach() * image @ classes.T + getattr(clip, "logit_bias", 0.0)
        loss = F.cross_entropy(logits, batch["labels"]) * 6 / 12
        grads = torch.autograd.grad(loss, weights)
        total = grads if total == 0 else [a + b for a, b in zip(total, grads)]
    for layer in range(LAYERS):
        per_proj = [(weights[3 * layer + i] * total[3 * layer + i]).abs().view(HEADS, -1).mean(dim=1) for i in range(3)]
        expected = torch.stack(per_proj).mean(dim=0)
        assert torch.allclose(got[layer], expected, rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("family", TWO_TOWERS)
def test_class_embeddings_are_computed_without_dropout_whatever_the_mode(family, clip_tokenizer):
    """A tower left in training mode (a wrapper's evaluation restores the mode it found) must not put dropout
    noise into the class embeddings: they are computed in eval mode and the mode is given back."""
    two_tower, tokenizer = TwoTowerModel.from_clip(TWO_TOWERS[family](seed=2, dropout=0.5)), clip_tokenizer
    reference = zero_shot_ensemble(two_tower.eval(), CLASSES, tokenizer, TEMPLATES).embeddings
    for _ in range(2):
        two_tower.train()
        assert torch.equal(zero_shot_ensemble(two_tower, CLASSES, tokenizer, TEMPLATES).embeddings, reference)
    two_tower.train()
    prompts = _prompts(two_tower, tokenizer)
    assert torch.equal(class_embeddings(two_tower.text, prompts, len(CLASSES)), reference)
    assert two_tower.text.training  # given back in the mode it came in


def test_other_classes_are_refused_for_a_zero_shot_ensemble_calibrated_class_by_class(tmp_path, clip_tokenizer):
    """A vector-scaling bias fitted for [cat, dog, car, tree] was applied to whichever class sat at its index once
    the saved ensemble was given other classes (load_classifier, predict --classes): refused. Temperature is the
    same for every class and carries over."""
    from hydra_ensembles.predictors import VectorScaling, load_classifier

    ensemble = zero_shot_ensemble(TwoTowerModel.from_clip(TWO_TOWERS["clip"]()), CLASSES, clip_tokenizer, TEMPLATES)
    fits = {"vector": VectorScaling(torch.ones(4), torch.tensor([5.0, 0.0, 0.0, 0.0])), "temperature": None}
    fits["temperature"] = TemperatureScaling(2.0)
    reordered = list(reversed(CLASSES))
    for name, calibration_map in fits.items():
        clip_tokenizer.save_pretrained(tmp_path / name)
        save_predictor(Calibrated(ensemble, calibration_map), tmp_path / name)
        assert load_classifier(tmp_path / name, classes=CLASSES) is not None  # its own classes
    with pytest.raises(ValueError, match=r"vector-scaled, fitted class by class for its classes \['cat'"):
        load_classifier(tmp_path / "vector", classes=reordered)
    assert load_classifier(tmp_path / "temperature", classes=reordered).model.classes == reordered
    # new prompts for the same classes change every logit the vector scaling was fitted on: refused as well, and
    # templates alone (no classes) were silently ignored
    with pytest.raises(ValueError, match="fitted class by class"):
        load_classifier(tmp_path / "vector", classes=CLASSES, templates=["a drawing of a {}."])
    with pytest.raises(ValueError, match="new templates re-prompt the saved classes; name them too"):
        load_classifier(tmp_path / "temperature", templates=["a drawing of a {}."])
    assert load_classifier(tmp_path / "vector", classes=CLASSES, templates=TEMPLATES) is not None  # the same prompts


@pytest.mark.parametrize("family", TWO_TOWERS)
def test_a_bf16_two_tower_model_classifies_before_and_after_a_save(family, tmp_path, clip_tokenizer):
    """The projections were rebuilt in fp32 (SigLIP's identity, and every tower's after loading) in front of bf16
    towers: "mat1 and mat2 must have the same dtype"."""
    two_tower = TwoTowerModel.from_clip(TWO_TOWERS[family]().to(torch.bfloat16))
    inputs = {"pixel_values": _images()["pixel_values"].to(torch.bfloat16)}
    before = zero_shot_ensemble(two_tower, CLASSES, clip_tokenizer, TEMPLATES)(**inputs).member_logits
    two_tower.save_pretrained(tmp_path / "tt")
    loaded = TwoTowerModel.from_pretrained(tmp_path / "tt")
    assert loaded.image.projection.weight.dtype == torch.bfloat16
    after = zero_shot_ensemble(loaded, CLASSES, clip_tokenizer, TEMPLATES)(**inputs).member_logits
    assert torch.equal(before, after)


def test_bf16_inference_keeps_the_scaled_cosines_in_fp32(clip_tokenizer):
    """Under bf16 autocast the projection, normalisation and cosines ran in bf16 and were then multiplied by the
    logit scale (~100 for CLIP): logits moved by tenths and 170 of 300 max-logits tied."""
    from hydra_ensembles.inference import prepare

    two_tower = TwoTowerModel.from_clip(TWO_TOWERS["clip"]())
    two_tower.logit_scale = 100.0
    ensemble = zero_shot_ensemble(two_tower, ["cat", "dog", "small red car", "tree"], clip_tokenizer, ["a {}."])
    inputs = {"pixel_values": torch.randn(300, 3, 16, 16, generator=torch.Generator().manual_seed(0))}
    with torch.no_grad():
        bf16 = prepare(ensemble, "bf16")(**inputs).member_logits[:, 0]
    assert bf16.dtype == torch.float32 and bf16.max(-1).values.unique().numel() == 300
