"""Candidate scorers for greedy circuit extraction: S of the model with `removed` plus one candidate turned off.

`ReferenceScorer` is Algorithm 1 written literally: one full evaluation of the HF model per candidate.
`FastScorer` computes the same scores with far less work:

- prefix caching: turning a head off in layer l changes nothing below l, so each step runs the model once
  (with the heads removed so far) and keeps the hidden states entering every layer;
- batched candidates: the candidates of layer l are the members of one fused pass: layer l's attention runs
  once and candidate c's output is the full output minus head c's term z_c W_o^(c); the C candidate streams
  then go through layers l+1.. as one batch of C x B;
- large batches: ID and OOD data are re-batched to `batch_size` examples; logits are kept in memory and scored
  at the end;
- removed heads are pruned structurally (exactly equal to ablating them), so each step is cheaper than the
  last, and the last layer computes only the token rows the classifier reads.

The two agree up to float rounding (a different but equivalent order of operations, ~1e-7 in fp32), which
can only change a score when two examples' maximum softmax probabilities lie that close, or (tie rule "score")
when two candidates' continuous secondary scores do.
"""

from __future__ import annotations

import contextlib
import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ...adapters import get_adapter
from ...data.loaders import Batch, per_example, rebatch, split_batch, to_device
from ...data.loaders import batch_size as examples_in
from ...outputs import labels_of
from ...pruning import ablate_heads, kept_heads, prune_heads
from ..gradients import gradients_for
from .criteria import TIE_BREAKS, CircuitCriterion

Head = tuple[int, int]
Value = tuple[float, ...]  # what candidates are compared by: (S,) or (S, secondary), see `criteria.TieBreak`
Progress = Callable[[int], object]
PRECISIONS = ("fp32", "bf16")


class Ticks:
    """Reports work to `progress` in whole candidates as it completes: a candidate evaluation is `examples`
    candidate-examples, and the fast scorer finishes them a batch of candidates on a chunk of examples at a time,
    so the bar moves within a step (one tick per candidate's worth of work)."""

    def __init__(self, progress: Progress, examples: int):
        self.progress, self.examples = progress, max(1, examples)
        self.work = self.reported = 0

    def add(self, candidate_examples: int) -> None:
        self.work += candidate_examples
        done = self.work // self.examples
        if done > self.reported:
            self.progress(done - self.reported)
            self.reported = done


class CandidateScorer(ABC):
    """Scores of candidate heads given the heads already removed.

    A scorer computes each candidate's model outputs over the ID then the OOD examples (`outputs`: logits, or
    an encoder's pooled embeddings) and the criterion scores the logits, as the tie rule `tie_break` compares
    them (`criteria.TIE_BREAKS`). `criterion=None` gives a scorer of outputs only (one tower of a joint
    circuit, `importance.circuit.joint`)."""

    def __init__(
        self,
        model: nn.Module,
        id_batches: list[Batch],
        ood_batches: list[Batch],
        criterion: CircuitCriterion | None,
        batch_size: int = 64,
        precision: str = "fp32",
        tie_break: str = "order",
    ):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}.")
        self.model = model
        self.adapter = get_adapter(model)
        self.id_batches, self.ood_batches = id_batches, ood_batches
        self.criterion, self.tie_break = criterion, TIE_BREAKS[tie_break]
        self.batch_size = batch_size
        self.precision = precision
        self.labels = labels_of(id_batches) if criterion is not None else None
        self.num_id = sum(examples_in(split_batch(self.adapter, b)[0]) for b in id_batches)

    def numerics(self) -> contextlib.AbstractContextManager:
        """The forward passes' arithmetic: fp32 as the model is, or bf16 autocast (matrix products in bfloat16,
        norms and softmax in fp32; approximate. A BERT-base forward: 2.7x faster on a Xeon with AMX; bf16 matrix
        products alone 2.0x on an AMD EPYC with AVX512-BF16 and no AMX)."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        device = next(self.model.parameters()).device.type
        return torch.autocast(device_type=device, dtype=torch.bfloat16)

    @abstractmethod
    def outputs(self, removed: Sequence[Head], candidates: Sequence[Head], progress: Progress) -> dict[Head, Tensor]:
        """Model outputs (N_id + N_ood, K), float32 on the CPU, with `removed` and each candidate turned off."""

    @abstractmethod
    def baseline_outputs(self, removed: Sequence[Head]) -> Tensor:
        """Model outputs (N_id + N_ood, K) with only `removed` turned off."""

    def score(self, removed: Sequence[Head], candidates: Sequence[Head], progress: Progress) -> dict[Head, Value]:
        """(S, ...) with `removed` and each candidate turned off, for every candidate (S first)."""
        return {head: self._value(out) for head, out in self.outputs(removed, candidates, progress).items()}

    def baseline(self, removed: Sequence[Head]) -> float:
        """S with only `removed` turned off."""
        return self._value(self.baseline_outputs(removed))[0]

    def _value(self, logits: Tensor) -> Value:
        ood = logits[self.num_id :] if len(logits) > self.num_id else None
        return self.tie_break.value(self.criterion, logits[: self.num_id], self.labels, ood)


class ReferenceScorer(CandidateScorer):
    """Literal: ablate, run the whole HF model over the data as given, restore — once per candidate."""

    def outputs(self, removed: Sequence[Head], candidates: Sequence[Head], progress: Progress) -> dict[Head, Tensor]:
        outputs = {}
        for head in candidates:
            outputs[head] = self.baseline_outputs([*removed, head])
            progress(1)
        return outputs

    def baseline_outputs(self, removed: Sequence[Head]) -> Tensor:
        heads: dict[int, list[int]] = {}
        for layer, h in removed:
            heads.setdefault(layer, []).append(h)
        device = next(self.model.parameters()).device
        parts, was_training = [], self.model.training
        try:
            with ablate_heads(self.model.eval(), heads), self.numerics(), torch.no_grad():
                for batch in self.id_batches + self.ood_batches:
                    inputs = to_device(split_batch(self.adapter, batch)[0], device)
                    parts.append(self.adapter.output(self.model, inputs).float().cpu())
        finally:
            self.model.train(was_training)  # evaluated without dropout, whatever mode it came in
        return torch.cat(parts)


class FastScorer(CandidateScorer):
    """Prefix-cached, candidate-batched scoring on the fusion engine (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pruned = copy.deepcopy(self.model)  # the model with the removed heads pruned away
        self.removed: list[Head] = []
        self._build()
        device = next(self.model.parameters()).device
        self.chunks = [to_device(c, device) for c in rebatch(self.id_batches + self.ood_batches, self.batch_size)]

    def outputs(self, removed: Sequence[Head], candidates: Sequence[Head], progress: Progress) -> dict[Head, Tensor]:
        self._ablate(removed)
        if not candidates:  # this rank's share is empty (fewer candidates than ranks): nothing to run
            return {}
        by_layer: dict[int, list[Head]] = {}
        for head in candidates:
            by_layer.setdefault(head[0], []).append(head)
        outputs: dict[Head, list[Tensor]] = {head: [] for head in candidates}
        ticks = Ticks(progress, sum(map(examples_in, self.chunks)))
        with torch.no_grad(), self.numerics():
            for chunk in self.chunks:
                states, mask = self.engine.prefix(chunk, max(by_layer, default=-1))
                for layer, heads in by_layer.items():
                    slots = [self.kept[layer].index(h) for _, h in heads]
                    out = self._candidates(chunk, states[layer], mask, layer, slots)  # (C, B, K)
                    for head, head_out in zip(heads, out):
                        outputs[head].append(head_out.float().cpu())
                    ticks.add(len(heads) * examples_in(chunk))
        return {head: torch.cat(parts) for head, parts in outputs.items()}

    def baseline_outputs(self, removed: Sequence[Head]) -> Tensor:
        self._ablate(removed)
        parts = []
        with torch.no_grad(), self.numerics():
            for chunk in self.chunks:
                last = self.engine.num_layers - 1
                states, mask = self.engine.prefix(chunk, last)
                x = self.engine.run_layers(states[-1], mask, start=last, queries=self.engine.head_tokens)
                parts.append(self.engine.classify(x, chunk)[0].float().cpu())
        return torch.cat(parts)

    def first_order(self, removed: Sequence[Head]) -> dict[Head, float]:
        """First-order estimate of the criterion's smooth surrogate after turning each remaining head off.

        Scaling head h's output by a gate g is scaling its column block of W_o by g, so at g = 1 the change
        from g = 1 to 0 is approximately -<W_o^(h), dS~/dW_o^(h)> (one backward pass gives every head's).
        """
        self._ablate(removed)
        model = self.pruned
        layers = self.adapter.layers(model)
        outputs = [self.adapter.block(layer).output.weight for layer in layers]
        with gradients_for(model, outputs):
            with torch.no_grad():
                logits = torch.cat([self.adapter.output(model, chunk) for chunk in self.chunks]).float()
            logits.requires_grad_(True)
            ood = logits[self.num_id :] if len(logits) > self.num_id else None
            surrogate = self.criterion.surrogate(logits[: self.num_id], self.labels, ood)
            (upstream,) = torch.autograd.grad(surrogate, logits)  # dS~/dlogits, (N, classes)
            grads = [torch.zeros_like(w) for w in outputs]
            start = 0
            for chunk in self.chunks:  # backpropagate chunk by chunk: memory stays one chunk's
                out = self.adapter.output(model, chunk)
                part = upstream[start : start + len(out)].to(out.dtype)
                for acc, g in zip(grads, torch.autograd.grad(out, outputs, grad_outputs=part)):
                    acc += g
                start += len(out)
        base, estimates = surrogate.item(), {}
        head_dim = self.adapter.head_dim(model)
        for layer, (weight, grad) in enumerate(zip(outputs, grads)):
            for slot, head in enumerate(self.kept[layer]):
                cols = slice(slot * head_dim, (slot + 1) * head_dim)
                estimates[(layer, head)] = base - (weight[:, cols] * grad[:, cols]).sum().item()
        return estimates

    def _candidates(self, chunk: dict, x: Tensor, mask: Tensor | None, layer: int, slots: list[int]) -> Tensor:
        """Outputs (C, B, K) of the candidates of one layer, as one batch of C x B streams."""
        count, batch, queries = len(slots), x.shape[1], self.engine.head_tokens
        last = layer == self.engine.num_layers - 1
        y = self.engine.ablation_candidates(layer, x, mask, slots, queries if last else None)  # (C, B, T, d)
        y = y.reshape(1, count * batch, *y.shape[2:])  # candidates stacked on the batch axis
        mask = self.engine.tile_mask(mask, count, batch)  # per-example masks (and rotary tables) follow the streams
        y = self.engine.run_layers(y, mask, start=layer + 1, queries=queries)
        tiled = {k: _tile(v, count) for k, v in chunk.items()}
        return self.engine.classify(y, tiled)[0].view(count, batch, -1)

    def _ablate(self, removed: Sequence[Head]) -> None:
        """Remove heads for good. Pruning them structurally equals ablating them (contract 2) and makes every
        later step cheaper; within one extraction the removed heads only ever grow."""
        if list(removed[: len(self.removed)]) != self.removed:
            raise ValueError("FastScorer: removed heads must extend the ones already removed.")
        new = removed[len(self.removed) :]
        if new:
            heads: dict[int, list[int]] = {}
            for layer, h in new:
                heads.setdefault(layer, []).append(h)
            prune_heads(self.pruned, heads)
            self.removed = list(removed)
            self._build()

    def _build(self) -> None:
        from ...fusion import HydraEnsemble  # fusion imports pruning; keep the import graph one-way

        self.engine = HydraEnsemble.fuse([self.pruned]).eval()  # one member: every tensor shared (G = 1)
        self.kept = kept_heads(self.pruned)


def _tile(value, count: int):
    """Repeat a model input `count` times along its batch axis (candidate-major); leave settings (`per_example`)
    alone."""
    if per_example(value):
        return value.repeat(count, *([1] * (value.dim() - 1)))
    return value
