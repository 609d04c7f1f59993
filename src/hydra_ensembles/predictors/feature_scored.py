"""A classifier with feature-space OOD detectors (MDS, RMDS, KNN, ViM) fit once on its training features and
saved with it (`evaluation.scores.collect_scores` scores a loader by any score name, logit or feature: it finds this
predictor by its `ood_scores`).

`fit_feature_scores(model, train_loader)` returns a `FeatureScored` predictor: it predicts exactly as `model`
(same member logits) and scores inputs with `ood_scores(inputs, name)`. Score names: "mds", "rmds", "knn", "vim" (one
detector per member on its own features, scores averaged) and "<name>_concat" (one detector on the members'
features concatenated); the maths is `feature_ood`. Saved as model/ (the predictor), detectors.safetensors
(every fitted tensor, float64 but KNN's training features, float32 as the model gave them) and predictor.json.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import Tensor, nn

from ..io import PREDICTOR_FILE, read_safetensors
from ..outputs import member_logits_of
from .feature_ood import CONCAT, FEATURE_SCORES, EnsembleDetector, Settings, TrainingFeatures
from .features import collect_features, feature_source, member_features
from .load import ModelWrapper, describe_saved, register_predictor

FEATURE_SCORE_NAMES = [name + variant for name in FEATURE_SCORES for variant in ("", CONCAT)]

DETECTORS_FILE = "detectors.safetensors"


@register_predictor
class FeatureScored(ModelWrapper):
    """Any classifier with fitted feature-space detectors. Returns the classifier's member_logits (B, M, C);
    `ood_scores` adds OOD scores. `examples`: how many training inputs the detectors were fit on."""

    kind = "feature_scored"

    def __init__(self, model: nn.Module, detectors: Mapping[str, EnsembleDetector], settings: Settings, examples: int):
        super().__init__(model)
        self.detectors = dict(detectors)
        self.settings = settings
        self.examples = examples

    @property
    def fitted_to_classes(self) -> bool:
        # class means (MDS, RMDS), the classifier's null space (ViM): fitted on the classes they saw; KNN: no class
        return any(name != "knn" for name in self.detectors)

    @property
    def score_names(self) -> list[str]:
        return [name + variant for name in self.detectors for variant in ("", CONCAT)]

    def forward(self, **inputs: Any) -> Any:
        return self.model(**inputs)

    @torch.no_grad()  # scores, not a graph of the whole forward pass (map_batches adds it; a direct call did not)
    def ood_scores(self, inputs: Mapping[str, Any], name: str) -> tuple[Tensor, Tensor]:
        """Member logits (B, M, C) of the classifier and the OOD score `name` (B,) float64, for model inputs (no
        labels): one forward pass, two when the classifier is a wrapper that changes its logits."""
        detector, concatenated = self._detector(name)
        source = feature_source(self.model)
        part = member_features(source, inputs)
        logits = part.logits if source is self.model else member_logits_of(self.model(**inputs))
        features, source_logits = part.features.double().cpu(), part.logits.double().cpu()  # the detectors: CPU
        return logits, detector.score(features, source_logits, concatenated)

    def _detector(self, name: str) -> tuple[EnsembleDetector, bool]:
        base = name.removesuffix(CONCAT)
        if base not in FEATURE_SCORES:
            raise ValueError(f"unknown OOD score {name!r}; this model's feature scores: {self.score_names}.")
        if base not in self.detectors:
            raise ValueError(
                f"OOD score {name!r} was not fit for this model; fitted: {self.score_names}. Fit it with "
                f"fit_feature_scores(..., scores=[{base!r}]) (hydra-ens ood --scores {base})."
            )
        return self.detectors[base], name.endswith(CONCAT)

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """model/ (the classifier), detectors.safetensors and predictor.json (kind, scores, settings), atomically."""

        record = {
            "scores": list(self.detectors),
            "members": len(next(iter(self.detectors.values())).members),
            "k": self.settings.k,
            "vim_dim": self.settings.vim_dim,
            "examples": self.examples,
        }

        def write_detectors(tmp: Path) -> None:
            safetensors.torch.save_file(_flatten(self.detectors), tmp / DETECTORS_FILE)

        return self.save_wrapped(path, record, write_detectors)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> FeatureScored:
        model, record = cls.load_wrapped(path)
        state = read_safetensors(Path(path) / DETECTORS_FILE)
        detectors = {name: _unflatten(state, name, record["members"]) for name in record["scores"]}
        settings = Settings(k=record["k"], vim_dim=record["vim_dim"])
        return cls(model, detectors, settings, record["examples"]).eval()

    @classmethod
    def describe(cls, path: Path) -> str:
        record = json.loads((path / PREDICTOR_FILE).read_text())
        scores = ", ".join(record["scores"])
        return f"{describe_saved(path / 'model')}, with OOD detectors ({scores}) fit on {record['examples']} inputs"


def fit_feature_scores(
    model: nn.Module,
    train: Iterable[Mapping[str, Any]],
    scores: Sequence[str] = tuple(FEATURE_SCORES),
    *,
    k: int = 50,
    vim_dim: int | None = None,
    progress: bool = False,
) -> FeatureScored:
    """`model` with feature-space detectors fit on a labelled training loader: each member's features (N, D)
    with the labels (N,) and its classifier's weights, one detector per member and one on the concatenation.
    k: KNN's neighbour (capped at N); vim_dim: ViM's principal dimension (None: Wang et al.'s rule)."""
    unknown = sorted(set(scores) - set(FEATURE_SCORES))
    if unknown or not scores:
        raise ValueError(f"unknown feature scores {unknown or scores}; choose from {sorted(FEATURE_SCORES)}.")
    read: list[Tensor] = []
    collected, found = collect_features(model, _labels_read(train, read), progress)  # one pass, nothing kept
    labels = torch.cat(read)
    if len(labels) != len(collected.features):
        raise ValueError(f"the training loader gave {len(labels)} labels for {len(collected.features)} inputs.")
    members = [
        TrainingFeatures(collected.features[:, m].double(), labels, weight.double().cpu(), bias.double().cpu())
        for m, (weight, bias) in enumerate(zip(found.weight, found.bias))
    ]
    settings = Settings(k, vim_dim)
    detectors = {name: EnsembleDetector.fit(name, members, settings) for name in scores}
    return FeatureScored(model, detectors, settings, len(labels)).eval()


def _labels_read(loader: Iterable[Mapping[str, Any]], read: list[Tensor]) -> Iterator[Mapping[str, Any]]:
    """The batches of `loader`, each batch's labels appended to `read` as it passes: the labels line up with the
    features of the same pass (a shuffling loader too), and no batch's inputs are kept."""
    for batch in loader:
        if batch.get("labels") is None:
            raise ValueError("feature scores are fit on labelled data: a batch of the training loader has no 'labels'.")
        read.append(torch.as_tensor(batch["labels"]).reshape(-1).cpu())
        yield batch


def _flatten(detectors: Mapping[str, EnsembleDetector]) -> dict[str, Tensor]:
    """{"<score>/member<m>/<field>" and "<score>/concat/<field>": tensor}; one member has no separate concat."""
    flat = {}
    for name, detector in detectors.items():
        parts = {f"member{m}": d for m, d in enumerate(detector.members)}
        if len(detector.members) > 1:
            parts["concat"] = detector.concatenated
        for part, fitted in parts.items():
            flat |= {f"{name}/{part}/{key}": t.contiguous() for key, t in fitted.state().items()}
    return flat


def _unflatten(state: Mapping[str, Tensor], name: str, members: int) -> EnsembleDetector:
    detector = FEATURE_SCORES[name]

    def part(which: str) -> Any:
        prefix = f"{name}/{which}/"
        return detector.from_state({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})

    fitted = [part(f"member{m}") for m in range(members)]
    return EnsembleDetector(fitted, part("concat") if members > 1 else fitted[0])
