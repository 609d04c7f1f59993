"""Joint circuits over both towers of a two-tower (CLIP-style) model, scored zero-shot (paper 000, §D.3).

The candidates are (tower, layer, head) for tower in ("image", "text"). Logits are zero-shot:

    image embeddings  z_i = normalise(P_img pooled_img(x_i))                      (N, P)
    class embeddings  w_c = normalise(mean_t normalise(P_txt pooled_txt(prompt(c, t))))   (C, P)
    logits            logit_scale * z_i . w_c                                     (N, C)

so ablating an image head changes the image embeddings and ablating a text head changes every class
embedding. S_acc, S_ood and S_avg are Algorithm 1's criteria on those logits, and the greedy loop is the one of
`extract_circuit`. Each tower is scored by its own candidate scorer — the fast one (prefix cache and batched
candidates, per tower) or the literal reference — and `towers=("image",)` ranks the image tower alone (the
text tower unpruned, §E.3.2).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from ...data.loaders import Batch, materialize
from ...distributed import is_main
from ...io import tensor_digest, weights_digest
from ...outputs import labels_of
from ...pruning import HeadMap, kept_heads
from .criteria import CRITERIA, TIE_BREAKS
from .methods import METHODS, Choice
from .record import CircuitRecord, head_map_from_json, say_ties
from .scoring import Value
from .search import greedy_removal, tie_rule

TOWERS = ("image", "text")
JointHead = tuple[str, int, int]


@dataclass
class JointCircuit(CircuitRecord):
    """The outcome of a joint circuit extraction: heads (tower, layer, head) in removal order, least useful
    first; `kept` holds each tower's head map when extraction started. The other fields are `CircuitRecord`'s."""

    head_order: ClassVar[str] = "(tower, layer, head)"

    removed: list[JointHead]
    kept: dict[str, HeadMap]

    def head_maps(self, budget: int | None = None) -> dict[str, HeadMap]:
        """Each tower's kept heads after removing the first `budget` heads of the ranking (all by default)."""
        return self.without(self.first_removed(budget))

    def without(self, removed: Iterable[JointHead]) -> dict[str, HeadMap]:
        """Each tower's head map once `removed` (tower, layer, head) are gone."""
        gone = set(removed)
        return {
            tower: {layer: [h for h in heads if (tower, layer, h) not in gone] for layer, heads in tower_kept.items()}
            for tower, tower_kept in self.kept.items()
        }

    @staticmethod
    def _head(values: list) -> JointHead:
        tower, layer, head = values
        return str(tower), int(layer), int(head)

    @staticmethod
    def _kept(data: dict) -> dict[str, HeadMap]:
        return {tower: head_map_from_json(kept) for tower, kept in data.items()}


class JointScorer:
    """Scores (tower, layer, head) candidates: each tower's scorer gives its outputs with the candidate off, the
    other tower's embeddings are those of the current step (computed once per step)."""

    def __init__(
        self,
        two_tower: Any,
        id_batches: list[Batch],
        ood_batches: list[Batch],
        prompt_batches: list[Batch],
        num_classes: int,
        criterion,
        scorer_class,
        batch_size: int = 64,
        precision: str = "fp32",
        tie_break: str = "order",
    ):
        options = {"batch_size": batch_size, "precision": precision}
        self.scorers = {
            "image": scorer_class(two_tower.image.encoder, id_batches, ood_batches, None, **options),
            "text": scorer_class(two_tower.text.encoder, prompt_batches, [], None, **options),
        }
        self.projections = {"image": two_tower.image.projection, "text": two_tower.text.projection}
        self.logit_scale, self.num_classes, self.criterion = two_tower.logit_scale, num_classes, criterion
        self.tie_break = TIE_BREAKS[tie_break]
        self.labels, self.num_id = labels_of(id_batches), self.scorers["image"].num_id
        self._current: dict[str, tuple[tuple, Tensor]] = {}  # tower -> (its removed heads, embeddings)

    def score(self, removed: Sequence[JointHead], candidates: Sequence[JointHead], progress) -> dict[JointHead, Value]:
        scores = {}
        for tower in TOWERS:
            heads = [(layer, h) for t, layer, h in candidates if t == tower]
            if not heads:
                continue
            current = {t: self._embeddings_now(t, removed) for t in TOWERS}
            for (layer, h), out in self.scorers[tower].outputs(_of(tower, removed), heads, progress).items():
                scores[(tower, layer, h)] = self._value(current | {tower: self._embeddings(tower, out)})
        return scores

    def baseline(self, removed: Sequence[JointHead]) -> float:
        return self._value({t: self._embeddings_now(t, removed) for t in TOWERS})[0]

    def _embeddings_now(self, tower: str, removed: Sequence[JointHead]) -> Tensor:
        key = tuple(_of(tower, removed))
        if tower not in self._current or self._current[tower][0] != key:
            outputs = self.scorers[tower].baseline_outputs(list(key))
            self._current[tower] = (key, self._embeddings(tower, outputs))
        return self._current[tower][1]

    @torch.no_grad()
    def _embeddings(self, tower: str, pooled: Tensor) -> Tensor:
        """Image embeddings (N, P), or class embeddings (C, P) from the prompts' pooled outputs (C*T, d)."""
        projection = self.projections[tower]
        weight = projection.weight  # the scorers' outputs are on the CPU; the tower may be on a GPU
        z = F.normalize(projection(pooled.to(weight.device, weight.dtype)).float().cpu(), dim=-1)
        if tower == "text":
            z = F.normalize(z.view(self.num_classes, -1, z.shape[-1]).mean(dim=1), dim=-1)
        return z

    def _value(self, embeddings: dict[str, Tensor]) -> Value:
        """(S, ...) of the zero-shot logits, as the tie rule compares them."""
        logits = self.logit_scale * embeddings["image"] @ embeddings["text"].T  # (N, C)
        ood = logits[self.num_id :] if len(logits) > self.num_id else None
        return self.tie_break.value(self.criterion, logits[: self.num_id], self.labels, ood)


def extract_joint_circuit(
    two_tower: Any,
    id_loader: Iterable[Batch],
    ood_loader: Iterable[Batch] | None,
    prompt_batches: Iterable[Batch],
    num_classes: int,
    criterion: str = "avg",
    budget: int | None = None,
    *,
    towers: Sequence[str] = TOWERS,
    method: str = "fast",
    batch_size: int = 64,
    top: int = 8,
    precision: str = "fp32",
    tie_break: str = "score",
    state_path: str | os.PathLike | None = None,
    progress: bool = True,
) -> JointCircuit:
    """Rank the heads of a two-tower model's `towers` by greedy removal (Algorithm 1) under zero-shot logits.

    Args:
        two_tower: a `predictors.TwoTowerModel` (anything with `.image` / `.text` towers, each `.encoder` and
            `.projection`, and `.logit_scale`); it is left unchanged.
        id_loader: labelled ID images; ood_loader: OOD images (for "ood" and "avg").
        prompt_batches: the tokenised `class_prompts(classes, templates)`, class-major, in order.
        num_classes: C; the prompts are C x templates.
        budget: heads to remove (default: a fifth of the candidates, a pool of twice 10 % of the heads).
        towers: whose heads are candidates: both (§D.3) or ("image",) (§E.3.2).
        method, batch_size, top, precision, tie_break, state_path, progress: as in `extract_circuit` ("fast" and
            "reference" are exact; "lazy" and "multi" approximate; "screen" is not available here).
    """
    if criterion not in CRITERIA:
        raise ValueError(f"unknown criterion {criterion!r}; choose from {sorted(CRITERIA)}.")
    if method not in METHODS or method == "screen":
        raise ValueError(
            f"method must be one of {sorted(set(METHODS) - {'screen'})} for joint circuits, got {method!r}."
        )
    if not towers or any(t not in TOWERS for t in towers):
        raise ValueError(f"towers must be a non-empty subset of {TOWERS}, got {list(towers)}.")
    score_fn = CRITERIA[criterion]
    tie_break, tie_said = tie_rule(tie_break, score_fn, criterion)
    id_batches = materialize(id_loader, "id_loader")
    if any(batch.get("labels") is None for batch in id_batches):
        raise ValueError("id_loader batches need 'labels' (circuit scores use ID accuracy / MSP on labelled data).")
    ood_batches = materialize(ood_loader, "ood_loader") if score_fn.needs_ood else []
    prompts = materialize(prompt_batches, "prompt_batches")
    kept = {tower: kept_heads(getattr(two_tower, tower).encoder) for tower in TOWERS}
    candidates = [(t, layer, h) for t in TOWERS if t in towers for layer, heads in kept[t].items() for h in heads]
    budget = max(2, len(candidates) // 5) if budget is None else budget  # the paper's pool: 2 x 10 % of the heads
    if not 1 <= budget < len(candidates):
        raise ValueError(
            f"budget must be between 1 and {len(candidates) - 1} ({len(candidates)} candidate heads in "
            f"{list(towers)}), got {budget}."
        )
    choice = Choice(method, top, precision)

    def scorer_for(search: Choice) -> JointScorer:
        scorer_class = METHODS[search.method].scorer
        return JointScorer(
            two_tower, id_batches, ood_batches, prompts, num_classes, score_fn, scorer_class, batch_size,
            search.precision, tie_break,
        )  # fmt: skip

    identity = {
        "version": 1,
        "criterion": criterion,
        "towers": list(towers),
        "search": choice.name,
        "tie_break": tie_break,
        "logit_scale": two_tower.logit_scale,
        "model": weights_digest(two_tower),
        "data": tensor_digest(
            v for batch in id_batches + ood_batches + prompts for _, v in sorted(batch.items()) if isinstance(v, Tensor)
        ),
    }
    ranking = greedy_removal(
        candidates, scorer_for, budget, choice, identity, state_path, progress, f"joint circuit ({criterion}"
    )
    circuit = JointCircuit(
        criterion,
        list(ranking.removed),
        ranking.scores,
        ranking.baseline,
        kept,
        search=ranking.search_name(),
        tie_break=tie_break,
        ties=ranking.ties,
    )
    if tie_said and progress and is_main():
        tqdm.write(f"joint circuit search: {tie_said}")
    if progress:
        say_ties(circuit, "joint circuit search")
    return circuit


def _of(tower: str, removed: Iterable[JointHead]) -> list[tuple[int, int]]:
    return [(layer, h) for t, layer, h in removed if t == tower]
