"""Zero-shot classification with two-tower (CLIP-style) models, and Hydra Ensembles of them without training
(paper 000 §5.3, §C.3, §D.3).

A two-tower model embeds images and texts in one space: each tower is a supported HF encoder (its pooled output,
(B, d)) followed by a linear projection (d -> P; the identity for SigLIP, whose towers project by themselves).
Zero-shot, a class is described by prompts: its embedding is the normalised mean over templates of the normalised
text embeddings of "a photo of a {class}", ... and an image's logits are logit_scale x the cosine similarities
with every class, plus logit_bias (SigLIP's, 0 for CLIP). SigLIP trains those logits as independent sigmoids;
the library reads them, as every predictor's, through a softmax over the classes (single-label zero-shot), which
the bias does not change; `torch.sigmoid(member_logits)` gives SigLIP's own per-class probabilities.

A zero-shot Hydra Ensemble has M members, member m = (image tower with head map m, text tower with head map m):

    class_embeddings[m] = normalise(mean_t normalise(text_m(prompt(c, t))))        (M, C, P), computed once
    member_logits[b, m] = logit_scale * normalise(image_m(x_b)) @ class_embeddings[m].T + logit_bias   (B, M, C)

The image members run fused (`HydraEnsemble`, one pass; members pruned from one model share every MLP weight,
so the merged MLP is exact), and so do the text members when the class embeddings are computed. Members share
the projections (only attention heads are pruned). The output is the usual `(B, M, C)`, so evaluation,
temperature scaling, `predict` and `evaluate` work unchanged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import safetensors.torch
import torch
import torch.nn.functional as F
import transformers
from torch import Tensor, nn

from ..adapters import get_adapter
from ..data.loaders import to_device
from ..fusion import HydraEnsemble
from ..io import PREDICTOR_FILE, read_safetensors, save_dir_atomic, write_json_atomic
from ..members import build_members
from ..outputs import PredictorOutput
from ..pruning import HeadMap, kept_heads
from ..pruning.heads import complement
from .load import HF_TWO_TOWER_MODELS, TWO_TOWER_FILE, load_predictor, register_predictor, save_predictor, saved_record

DEFAULT_TEMPLATES = ("a photo of a {}.",)


class Tower(nn.Module):
    """One encoder of a two-tower model: a supported HF encoder without a classifier (or a `HydraEnsemble` of its
    members) and the linear projection into the shared space, shared by all members."""

    def __init__(self, encoder: nn.Module, projection: nn.Linear):
        super().__init__()
        self.encoder, self.projection = encoder, projection

    @property
    def input_names(self) -> tuple[str, ...]:
        return _adapter(self.encoder).input_names

    def forward(self, **inputs) -> Tensor:
        """Normalised embeddings (B, M, P): M members (1 for a plain encoder)."""
        inputs = {k: v for k, v in inputs.items() if k in self.input_names}
        if isinstance(self.encoder, HydraEnsemble):
            pooled = self.encoder(**inputs).member_pooled  # (B, M, d)
        else:
            pooled = get_adapter(self.encoder).output(self.encoder, inputs)[:, None]  # (B, 1, d)
        return project(self.projection, pooled)


def project(projection: nn.Linear, pooled: Tensor) -> Tensor:
    """`projection(pooled)`, normalised, in float32 at least and outside autocast: the cosines are scaled by the
    logit scale (about 100 for CLIP), so bf16's rounding of them would move the logits by tenths (and tie them)."""
    dtype = torch.promote_types(pooled.dtype, torch.float32)
    bias = projection.bias.to(dtype) if projection.bias is not None else None
    with torch.autocast(pooled.device.type, enabled=False):
        return F.normalize(F.linear(pooled.to(dtype), projection.weight.to(dtype), bias), dim=-1)


def identity_projection(dim: int, dtype: torch.dtype = torch.float32) -> nn.Linear:
    """The projection of a tower whose pooled output is already in the shared space (SigLIP's): x @ I is exactly
    x in floating point (each output sums x_i and zeros), and it saves and scores as any projection does."""
    projection = nn.Linear(dim, dim, bias=False, dtype=dtype)
    with torch.no_grad():
        projection.weight.copy_(torch.eye(dim))
    return projection.requires_grad_(False)


def _clip_towers(model: nn.Module) -> tuple[Tower, Tower]:
    return Tower(model.vision_model, model.visual_projection), Tower(model.text_model, model.text_projection)


def _siglip_towers(model: nn.Module) -> tuple[Tower, Tower]:
    config, dtype = model.config, model.dtype  # in the towers' dtype: a bf16 tower's output meets a bf16 weight
    image = Tower(model.vision_model, identity_projection(config.vision_config.hidden_size, dtype))  # MAP head: (B, d)
    return image, Tower(model.text_model, identity_projection(config.text_config.projection_size, dtype))


# HF two-tower class -> its (image, text) towers; see also `load.HF_TWO_TOWER_MODELS` (their model types).
HF_TWO_TOWERS = {"CLIPModel": _clip_towers, "SiglipModel": _siglip_towers}


@register_predictor
class TwoTowerModel(nn.Module):
    """An image tower, a text tower, the logit scale (CLIP's exp(logit_scale), e.g. 100) and the logit bias
    (SigLIP's, e.g. -10; 0 for CLIP). Not a predictor by itself: `zero_shot_ensemble` makes one that classifies
    given classes."""

    kind = "two_tower"

    def __init__(self, image: Tower, text: Tower, logit_scale: float, logit_bias: float = 0.0):
        super().__init__()
        self.image, self.text, self.logit_scale = image, text, float(logit_scale)
        self.logit_bias = float(logit_bias)

    @classmethod
    def from_clip(cls, model: nn.Module) -> TwoTowerModel:
        """The towers of an HF CLIP-style model, `CLIPModel` or `SiglipModel` (its modules, not copies)."""
        towers = next((HF_TWO_TOWERS[c.__name__] for c in type(model).__mro__ if c.__name__ in HF_TWO_TOWERS), None)
        if towers is None:
            raise TypeError(f"from_clip needs one of {sorted(HF_TWO_TOWERS)}, got {type(model).__name__}.")
        bias = model.logit_bias.item() if hasattr(model, "logit_bias") else 0.0
        return cls(*towers(model), model.logit_scale.exp().item(), bias)

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """image/ and text/ (HF checkpoints), projections.safetensors, two_tower.json; atomically."""

        def write(tmp: Path) -> None:
            save_predictor(self.image.encoder, tmp / "image", card=False)  # cards cost an unpruned copy
            save_predictor(self.text.encoder, tmp / "text", card=False)
            _save_projections(tmp, self.image.projection, self.text.projection)
            write_json_atomic(tmp / TWO_TOWER_FILE, {"logit_scale": self.logit_scale, "logit_bias": self.logit_bias})

        return save_dir_atomic(path, write)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> TwoTowerModel:
        """A saved `TwoTowerModel`, or an HF `CLIPModel` / `SiglipModel` checkpoint directory."""
        path = Path(path)
        if (path / TWO_TOWER_FILE).is_file():
            record = json.loads((path / TWO_TOWER_FILE).read_text())
            image, text = _load_projections(path)
            towers = Tower(load_predictor(path / "image"), image), Tower(load_predictor(path / "text"), text)
            return cls(*towers, record["logit_scale"], record.get("logit_bias", 0.0)).eval()
        config = transformers.AutoConfig.from_pretrained(path)
        if config.model_type not in HF_TWO_TOWER_MODELS:
            raise ValueError(
                f"{str(path)!r} is a {config.model_type!r} checkpoint; a two-tower model is a saved TwoTowerModel "
                f"({TWO_TOWER_FILE}) or an HF directory of one of {sorted(HF_TWO_TOWER_MODELS.values())}."
            )
        model_class = getattr(transformers, HF_TWO_TOWER_MODELS[config.model_type])
        return cls.from_clip(model_class.from_pretrained(path).eval()).eval()

    @classmethod
    def describe(cls, path: Path) -> str:
        return "a two-tower (CLIP-style) model"


def class_prompts(classes: Sequence[str], templates: Sequence[str] = DEFAULT_TEMPLATES) -> list[str]:
    """Every template filled with every class, class-major: [t0(c0), t1(c0), ..., t0(c1), ...]."""
    if not classes or not templates:
        raise ValueError("zero-shot classification needs at least one class name and one template.")
    if any("{}" not in t for t in templates):
        raise ValueError(f"every template must contain '{{}}' where the class name goes, got {list(templates)}.")
    return [template.format(name) for name in classes for template in templates]


@torch.no_grad()
def class_embeddings(text: Tower, prompts: Sequence[dict], num_classes: int) -> Tensor:
    """(M, C, P): per member, the normalised mean over templates of the normalised prompt embeddings.
    `prompts`: the tokenised `class_prompts`, in order (`prompt_batches`). The tower runs in eval mode (no
    dropout), whatever mode it is in, and is put back in it."""
    was_training, device = text.training, next(text.parameters()).device  # prompts are tokenised on the CPU
    try:
        embedded = torch.cat([text.eval()(**to_device(batch, device)) for batch in prompts])  # (C*T, M, P)
    finally:
        text.train(was_training)
    if embedded.shape[0] % num_classes:
        raise ValueError(f"{embedded.shape[0]} prompts do not split evenly into {num_classes} classes.")
    per_class = embedded.view(num_classes, -1, *embedded.shape[1:]).mean(dim=1)  # (C, M, P)
    return F.normalize(per_class, dim=-1).transpose(0, 1).contiguous()


@register_predictor
class ZeroShotEnsemble(nn.Module):
    """M two-tower members classifying zero-shot: `forward(pixel_values=...)` returns member logits (B, M, C).

    image: the image tower (a plain encoder, or its members fused); text: the text tower likewise, kept to
    recompute the class embeddings for other classes (`set_classes`). M = 1 for the unpruned model.
    """

    kind = "zero_shot"

    def __init__(
        self,
        image: Tower,
        text: Tower,
        logit_scale: float,
        classes: Sequence[str],
        templates: Sequence[str],
        embeddings: Tensor,
        logit_bias: float = 0.0,
    ):
        super().__init__()
        self.image, self.text, self.logit_scale = image, text, float(logit_scale)
        self.logit_bias = float(logit_bias)  # SigLIP's; adding it changes no softmax over the classes
        self.classes, self.templates = list(classes), list(templates)
        self.register_buffer("embeddings", embeddings)  # (M or 1, C, P)
        self.is_classifier = True

    @property
    def num_members(self) -> int:
        return max(_members(self.image.encoder), _members(self.text.encoder))

    def head_counts(self) -> list[tuple[int, int]]:
        """(image heads, text heads) kept by each member."""
        counts = []
        for tower in (self.image.encoder, self.text.encoder):
            maps = tower.head_maps if isinstance(tower, HydraEnsemble) else [kept_heads(tower)]
            counts.append([sum(len(heads) for heads in head_map.values()) for head_map in maps])
        members = self.num_members
        return [(counts[0][m % len(counts[0])], counts[1][m % len(counts[1])]) for m in range(members)]

    @property
    def config(self) -> transformers.PretrainedConfig:
        """A config that names the classes (`id2label`, `label2id`), as a classifier's does."""
        labels = dict(enumerate(self.classes))
        return transformers.PretrainedConfig(id2label=labels, label2id={v: k for k, v in labels.items()})

    @torch.no_grad()
    def set_classes(
        self,
        classes: Sequence[str],
        templates: Sequence[str],
        tokenizer: transformers.PreTrainedTokenizerBase,
        batch_size: int = 64,
    ) -> None:
        """Recompute the class embeddings (once per member) for `classes` x `templates`."""
        batches = prompt_batches(tokenizer, classes, templates, self.text, batch_size)
        self.embeddings = class_embeddings(self.text, batches, len(classes))
        self.classes, self.templates = list(classes), list(templates)

    def readout(self, member: int = 0) -> Callable[[Tensor], Tensor]:
        """Member `member`'s zero-shot head as a function of its image encoder's pooled output: (B, d) -> logits
        (B, C), differentiable (e.g. `taylor_head_scores(image_encoder, ..., readout=...)`)."""
        classes = self.embeddings[min(member, len(self.embeddings) - 1)]  # (C, P)

        def logits(pooled: Tensor) -> Tensor:
            image = project(self.image.projection, pooled)
            with torch.autocast(pooled.device.type, enabled=False):  # the scaled cosines, as in `project`
                return self.logit_scale * image @ classes.T.to(image.dtype) + self.logit_bias

        return logits

    def forward(self, **inputs) -> PredictorOutput:
        images, classes = self.image(**inputs), self.embeddings  # (B, M or 1, P), (M or 1, C, P)
        members = max(images.shape[1], classes.shape[0])  # a tower left unpruned serves every member
        images, classes = images.expand(-1, members, -1), classes.expand(members, -1, -1).to(images.dtype)
        with torch.autocast(images.device.type, enabled=False):  # the scaled cosines, as in `project`
            logits = self.logit_scale * torch.einsum("bmp,mcp->bmc", images, classes) + self.logit_bias  # (B, M, C)
        return PredictorOutput(member_logits=logits)

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """image/ and text/ (HF checkpoints or Hydra Ensembles), projections, class embeddings and
        predictor.json, atomically; `hydra_ensembles.predictors.load_predictor` reads it back."""

        def write(tmp: Path) -> None:
            for name, tower in (("image", self.image), ("text", self.text)):
                save_predictor(tower.encoder, tmp / name, card=False)  # the wrapper's directory has the card
            _save_projections(tmp, self.image.projection, self.text.projection)
            safetensors.torch.save_file({"embeddings": self.embeddings.contiguous()}, str(tmp / "classes.safetensors"))
            record = {"kind": self.kind, "logit_scale": self.logit_scale, "logit_bias": self.logit_bias}
            record |= {"classes": self.classes}
            write_json_atomic(tmp / PREDICTOR_FILE, record | {"templates": self.templates})

        return save_dir_atomic(path, write)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> ZeroShotEnsemble:
        path = Path(path)
        record = saved_record(path, cls)
        image, text = _load_projections(path)
        embeddings = read_safetensors(path / "classes.safetensors")["embeddings"]
        towers = [
            Tower(load_predictor(path / name), projection) for name, projection in (("image", image), ("text", text))
        ]
        scale, bias = record["logit_scale"], record.get("logit_bias", 0.0)  # saves before SigLIP have no bias
        model = cls(*towers, scale, record["classes"], record["templates"], embeddings, bias)
        return model.eval()

    @classmethod
    def describe(cls, path: Path) -> str:
        classes = json.loads((path / PREDICTOR_FILE).read_text())["classes"]
        return f"a zero-shot two-tower ensemble over {len(classes)} classes"


def zero_shot_ensemble(
    two_tower: TwoTowerModel,
    classes: Sequence[str],
    tokenizer: transformers.PreTrainedTokenizerBase,
    templates: Sequence[str] = DEFAULT_TEMPLATES,
    image_head_maps: Sequence[HeadMap] | None = None,
    text_head_maps: Sequence[HeadMap] | None = None,
) -> ZeroShotEnsemble:
    """A zero-shot classifier of `classes`: the unpruned model (no head maps), or M members pruned from
    `two_tower` — both towers (both lists, one map per member each) or one tower (the other list None: that
    tower unpruned, shared by all members). Each pruned tower's members are fused."""
    image_head_maps = _completed(two_tower.image, image_head_maps)  # a map that omits a layer keeps it whole:
    text_head_maps = _completed(two_tower.text, text_head_maps)  # spelt out, equal maps compare equal
    counts = {len(maps) for maps in (image_head_maps, text_head_maps) if maps is not None}
    if len(counts) > 1:
        raise ValueError(f"image and text head maps must give the same number of members, got {sorted(counts)}.")
    pairs = list(zip(*(maps or [None] * max(counts, default=1) for maps in (image_head_maps, text_head_maps))))
    if len(pairs) > 1 and all(pair == pairs[0] for pair in pairs):  # each tower would collapse to one model
        raise ValueError(
            f"all {len(pairs)} members prune the same (image, text) heads: identical members have no model "
            "uncertainty. Give them different head maps (hydra-ens members draws them), or one map for one model."
        )
    image = _tower(two_tower.image, image_head_maps)
    text = _tower(two_tower.text, text_head_maps)
    no_classes = torch.zeros(1, 1, 1)
    model = ZeroShotEnsemble(image, text, two_tower.logit_scale, classes, templates, no_classes, two_tower.logit_bias)
    model.set_classes(classes, templates, tokenizer)
    return model.eval()


def member_logits_one_by_one(
    two_tower: TwoTowerModel,
    inputs: dict,
    prompts: Sequence[dict],
    num_classes: int,
    image_head_maps: Sequence[HeadMap] | None,
    text_head_maps: Sequence[HeadMap] | None,
) -> Tensor:
    """The definition, for tests and checks: each member built as its own pruned towers and run alone, its
    logits stacked (B, M, C)."""
    count = len(image_head_maps or text_head_maps or [None])
    logits = []
    for m in range(count):
        towers = [
            Tower(build_members(tower.encoder, [maps[m]])[0] if maps else tower.encoder, tower.projection)
            for tower, maps in ((two_tower.image, image_head_maps), (two_tower.text, text_head_maps))
        ]
        embeddings = class_embeddings(towers[1], prompts, num_classes)[0]  # (C, P)
        logits.append(two_tower.logit_scale * towers[0](**inputs)[:, 0] @ embeddings.T + two_tower.logit_bias)
    return torch.stack(logits, dim=1)


def _completed(tower: Tower, head_maps: Sequence[HeadMap] | None) -> list[HeadMap] | None:
    """`head_maps` with every layer of the tower, sorted (a layer a map leaves out keeps the heads it has)."""
    if head_maps is None:
        return None
    kept, completed = kept_heads(tower.encoder), []
    for head_map in head_maps:
        pruned = complement(kept, head_map, "head")  # checked as keep_heads checks it: layers and heads it has
        completed.append({layer: [h for h in heads if h not in pruned.get(layer, ())] for layer, heads in kept.items()})
    return completed


def _tower(tower: Tower, head_maps: Sequence[HeadMap] | None) -> Tower:
    """The tower for members with these head maps: fused; one pruned model if the members agree on it (it then
    serves all of them); the tower itself for None. Members are distinct as (image, text) pairs, so one tower
    may repeat a map (two members pruning the same text heads): allowed here."""
    if not head_maps:
        return tower
    if all(head_map == head_maps[0] for head_map in head_maps):
        return Tower(build_members(tower.encoder, head_maps[:1])[0], tower.projection)
    members = build_members(tower.encoder, head_maps, allow_identical=True)
    return Tower(HydraEnsemble.fuse(members, mlp="average", allow_identical=True).eval(), tower.projection)


def prompt_batches(
    tokenizer: transformers.PreTrainedTokenizerBase,
    classes: Sequence[str],
    templates: Sequence[str],
    text: Tower,
    batch_size: int = 64,
) -> list[dict]:
    """The tokenised `class_prompts`, in order, with only the inputs the text tower reads, padded as the tower's
    family needs (`Adapter.prompt_padding`: SigLIP's to the tokenizer's maximum length)."""
    prompts = class_prompts(classes, templates)
    padding = _adapter(text.encoder).prompt_padding
    batches = []
    for start in range(0, len(prompts), batch_size):
        tokens = tokenizer(prompts[start : start + batch_size], padding=padding, truncation=True, return_tensors="pt")
        batches.append({k: v for k, v in tokens.items() if k in text.input_names})
    return batches


def _adapter(encoder: nn.Module):
    return encoder.adapter if isinstance(encoder, HydraEnsemble) else get_adapter(encoder)


def _members(encoder: nn.Module) -> int:
    return encoder.num_members if isinstance(encoder, HydraEnsemble) else 1


def _save_projections(path: Path, image: nn.Linear, text: nn.Linear) -> None:
    tensors = {f"image.{k}": v for k, v in image.state_dict().items()}
    tensors |= {f"text.{k}": v for k, v in text.state_dict().items()}
    safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "projections.safetensors"))


def _load_projections(path: Path) -> tuple[nn.Linear, nn.Linear]:
    tensors = read_safetensors(path / "projections.safetensors")
    projections = []
    for name in ("image", "text"):
        weight, bias = tensors[f"{name}.weight"], tensors.get(f"{name}.bias")
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype)  # as saved
        linear.load_state_dict({"weight": weight} | ({"bias": bias} if bias is not None else {}))
        projections.append(linear)
    return projections[0], projections[1]
