"""The comparison of the paper's Tables 1-2 on one task (`TABLE`, run by `bench.runner`): every baseline and both
Hydra Ensembles per seed, then mean ± std over seeds as markdown and JSON tables, plus figures.

`ROWS` is the main table. Hydra (Taylor) and Hydra (Circ) are the paper's method: sequential Taylor scores
(§D.1.1), circuits by greedy removal (§D.1.2; exact, or the approximation a task names), fine-tuned members fused
with the merged (averaged) MLP (§4.2); "…, stacked MLP" fuses the same members keeping each one's own MLP (exact,
more parameters). `REVIEW_ROWS` answer reviewers (paper §B.1-B.3): no fine-tuning (Table 4), CircAcc and CircOOD
(Table 6); after them come the paper's efficient ensembles (Table 1; Packed-Ensembles and MIMO train from scratch,
so only on a task whose Single does: image-fmnist), then Hydra (Circ) with members identical in their first half or
three quarters of the layers, run once when fused (`TRUNK_ROWS`, drawn by `bench.curve`'s cost/quality table).
`head_sweep` gives Figures 5-6. Choices are made on validation data only (early stopping, the temperature); no row
is chosen or dropped after seeing test data.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
import shutil
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path

import torch
from torch import Tensor, nn

from ..adapters import get_adapter
from ..evaluation import plots
from ..evaluation.bootstrap import difference_lines, row_differences
from ..evaluation.compare import Built, row_file
from ..evaluation.report import evaluate, measure
from ..evaluation.tables import COLUMNS, CONVENTIONS, mean_std, per_set_lines, render, table_lines
from ..fusion import HydraEnsemble
from ..importance import Circuit, extract_circuit, oba_prune, taylor_head_scores
from ..io import read_json_record, torch_save_atomic, weights_digest, write_json_atomic
from ..members import build_members, head_map_overlap, sample_members
from ..outputs import collect_member_logits, labels_of
from ..predictors import (
    Calibrated,
    DeepEnsemble,
    MCDropout,
    TemperatureScaling,
    batch_ensemble,
    fit_temperature,
    load_predictor,
    lora_ensemble,
    mimo,
    packed_ensemble,
    save_predictor,
    shared_backbone_ensemble,
    train_mimo,
    train_packed,
)
from ..pruning import kept_neurons, linear_parameters, mask_weights, prune_heads
from ..training import finetune, finetune_fused
from . import runner
from .records import DIGESTS, check_digest, checked_single, discard_stale_state, rebuilt_notes, same_build_stand_ins
from .runner import SeedRun, Table

PLOTTED = ("Single", "Deep Ensembles", "Hydra (Taylor)", "Hydra (Circ)")
# the OBA row's pruning rounds (the authors': 49), each one double-backward pass over the calibration data
OBA_STEPS = 10
TRAINING = "training.json"  # {model name: its epochs (loss, validation metrics) and the epoch kept}, per seed


class NotTrained(LookupError):
    """A row asked of the cache alone (`cached_row`) needs a model, scores or a circuit not made yet."""


class Pieces:
    """What one seed's rows share, each built once and cached in the seed's directory: the single model (or the
    `base` the rows start from), its shape, Taylor scores, circuits and fine-tuned members. Every model built or
    loaded is checked against its records (`bench.records`). `cache_only`: load what the cache holds, make
    nothing (`NotTrained` instead) and write no record: a running benchmark may be writing the seed's now."""

    def __init__(self, run: SeedRun, cache_only: bool = False):
        self.task, self.seed, self.cache = run.task, run.seed, run.cache
        self.progress, self.base, self.device = run.progress, run.base, run.device
        self.cache_only = cache_only
        self._single: nn.Module | None = None

    def _making(self, path: Path) -> None:
        """Called before making what `path` will hold: refused when cache-only."""
        if self.cache_only:
            raise NotTrained(f"{path} is not in the cache yet: the benchmark has not made it.")

    @property
    def shape(self) -> dict:
        """{"heads": per layer, "layers", "widths": [MLP hidden size per block]} of the single model, recorded in
        `shape.json` so that tables render from the records without the model."""
        path = self.cache / "shape.json"
        if not path.exists():
            self._making(path)
            single, adapter = self.single(), get_adapter(self.single())
            widths = [len(kept) for kept in kept_neurons(single).values()]
            write_json_atomic(
                path, {"heads": adapter.num_heads(single), "layers": adapter.num_layers(single), "widths": widths}
            )
        return json.loads(path.read_text())

    @property
    def heads(self) -> int:
        return self.shape["heads"]

    @property
    def layers(self) -> int:
        return self.shape["layers"]

    def trained(self, name: str, build: Callable[[], nn.Module], checkpoint: str | None = None) -> nn.Module:
        """`cached`, checked against its recorded digest."""
        model = self.cached(name, build, checkpoint)
        if not self.cache_only:  # cache-only: its digest was recorded when it was cached
            check_digest(self.cache, name, model)
        return model

    def cached(self, name: str, build: Callable[[], nn.Module], checkpoint: str | None = None) -> nn.Module:
        """The predictor cached under `name`, or `build()`'s, cached now. `checkpoint`: the folder under
        checkpoints/ that `build` trains in (to resume after a stop), deleted once the model is saved: it holds
        the optimiser state and a copy of the best weights, ~4x the model (1.7 GB for MPNet-base)."""
        path = self.cache / "models" / name
        if path.exists():
            return load_predictor(path).to(self.device)
        self._making(path)
        model = build()
        if hasattr(model, "training_history"):  # a record: why an epoch was kept, checkable without the weights
            self._record_training(name, {"epochs": model.training_history, "kept_epoch": model.kept_epoch})
        save_predictor(model, path)
        if checkpoint is not None:
            shutil.rmtree(self.cache / "checkpoints" / checkpoint, ignore_errors=True)
        return model

    def _record_training(self, name: str, epochs: dict) -> None:
        """Keep how `name` trained in `TRAINING`, before its weights are saved (a stop in between trains it again and
        writes the same). A record that says otherwise is a model recorded elsewhere and trained again here to
        other weights (`records.check_digest`): the first stays, as the rows recorded before were measured on it,
        and this one is kept as "<name>, rebuilt" (a third build as "<name>, rebuilt 2", and so on)."""
        recorded = read_json_record(self.cache / TRAINING)
        key = next(key for key in _build_keys(name) if recorded.get(key, epochs) == epochs)
        write_json_atomic(self.cache / TRAINING, recorded | {key: epochs})

    def training_of(self, name: str, model: nn.Module) -> dict:
        """How the model `name` of this seed trained (its `TRAINING` record): the first build's when `model` has
        the recorded weights (or none are recorded), else the latest rebuild's, as the cache holds its latest build."""
        recorded = read_json_record(self.cache / TRAINING)
        if read_json_record(self.cache / DIGESTS).get(name) in (None, weights_digest(model)):
            return recorded[name]
        builds = list(itertools.takewhile(recorded.__contains__, _build_keys(name)))
        return recorded[builds[-1]]

    def single(self) -> nn.Module:
        if self._single is None and self.base:
            self._single = self.base()
        elif self._single is None and self.cache_only:
            self._single = self.cached("single", *self.from_start(self.seed))
        elif self._single is None:
            model = self.cached("single", *self.from_start(self.seed))
            self._single = checked_single(self.cache, model, self._measure_as_single)
        return self._single

    def _measure_as_single(self, model: nn.Module, logits: Path) -> dict:
        return measure(model, self.task.test, self.task.near, self.task.far, logits)

    def from_start(self, seed: int, dropout: bool = False) -> tuple[Callable[[], nn.Module], str]:
        """`cached`'s build and checkpoint for a model fine-tuned from the pretrained weights with `seed` (with
        `dropout`: the task's `dropout_model`)."""
        task, folder = self.task, f"start{seed}" + ("-dropout" if dropout else "")

        def train() -> nn.Module:
            model = (task.dropout_model if dropout else task.new_model)(seed).to(self.device)
            recipe = task.recipe.with_(seed=seed)
            directory = self.cache / "checkpoints" / folder
            return finetune(
                model, task.train, recipe, val_loader=task.val, checkpoint_dir=directory, progress=self.progress
            )

        return train, folder

    @property
    def calibration(self) -> list:
        """The labelled data that importance scores read (Taylor, OBA): the first training batches, as many batches
        as the validation split has."""
        return self.task.train[: max(1, len(self.task.val))]

    def taylor_scores(self, budget: int | None = None) -> Tensor:
        """Sequential Taylor scores (§D.1.1): layer by layer, the layer's `budget` (default: the task's
        `prune_per_layer`) lowest heads are pruned before the next layer is scored."""
        budget = self.task.prune_per_layer if budget is None else budget
        suffix = "" if budget == self.task.prune_per_layer else f"_b{budget}"
        path = self.cache / f"taylor_scores_sequential{suffix}.pt"
        if not path.exists():
            self._making(path)
            scores = taylor_head_scores(
                self.single(), self.calibration, sequential_budget=budget, progress=self.progress
            )
            torch_save_atomic(scores.cpu(), path)
        return torch.load(path)

    def circuit(self, criterion: str = "avg") -> Circuit:
        path, state = self.cache / f"circuit_{criterion}.json", self.cache / f"circuit_{criterion}_state.json"
        if not path.exists():
            self._making(path)
            discard_stale_state(state, self.single())
            task = self.task
            budget = circuit_removals(task, self.layers)
            circuit = extract_circuit(
                self.single(),
                task.circuit_id,
                task.circuit_ood,
                criterion,
                budget,
                method=task.circuit_method,
                top=task.circuit_top,
                precision=task.circuit_precision,
                tie_break=task.circuit_tie_break,
                state_path=state,
                progress=self.progress,
            )
            circuit.save(path)
        return Circuit.load(path)

    def fine_tuned(self, model: nn.Module, name: str, seed: int, train=finetune) -> nn.Module:
        """`model` (a pruned member, a copy of the single model, a fused ensemble) trained in place by `train` with
        the task's recipe for pruned models, the best validation epoch kept, checkpointed under `name`."""
        task, directory = self.task, self.cache / "checkpoints" / name
        recipe = task.member_recipe.with_(seed=seed)
        return train(model, task.train, recipe, val_loader=task.val, checkpoint_dir=directory, progress=self.progress)

    def fine_tuned_members(self, prefix: str, head_maps, fine_tune: bool = True) -> list[nn.Module]:
        """Members pruned to `head_maps` from the single model, fine-tuned (cached under a name that includes the
        head map) or, without `fine_tune`, as they are (zero-shot, paper Table 4)."""
        if not fine_tune:
            return build_members(self.single(), head_maps)
        members = []
        for m, head_map in enumerate(head_maps):
            seed, name = self.seed * 100 + m, f"{prefix}{m}-{_digest(head_map)}"

            def build(head_map=head_map, seed=seed, name=name) -> nn.Module:
                member = build_members(self.single(), [head_map])[0]
                return self.fine_tuned(member, name, seed)

            members.append(self.trained(name, build, checkpoint=name))
        return members


# ---- rows: name -> build(pieces) ----


def _single(p: Pieces) -> Built:
    return Built(p.single(), {"heads": str(p.heads)})


ENGINE = "Single, fused engine"  # Single's predictions at the fused engine's cost (`_single_fused`)


def _single_fused(p: Pieces) -> Built:
    """The single model on the fused engine (`HydraEnsemble.fuse([single])`): its predictions (equal within the
    fusion contract), at the engine's cost. The Hydra rows run on this engine, whose last layer computes only the
    tokens the classifier reads, so their FLOPs and latency x this row are the ensemble's own cost, the engine's
    saving taken out."""
    return Built(HydraEnsemble.fuse([p.single()]), {"heads": str(p.heads)})


def _deep_ensemble(p: Pieces) -> Built:
    seed, members = p.seed, p.task.members
    others = [p.trained(f"start{seed}-{m}", *p.from_start(seed * 100 + 50 + m)) for m in range(1, members)]
    return Built(DeepEnsemble([p.single(), *others]), {"heads": f"{p.heads}x{members}"})


def _deep_ensemble_d(p: Pieces) -> Built:
    task, seeds = p.task, [p.seed * 100 + m for m in range(p.task.members)]

    def build() -> nn.Module:  # the single model only when the ensemble is not cached
        return shared_backbone_ensemble(p.single(), task.train, seeds, epochs=task.head_epochs, progress=p.progress)

    return Built(p.trained("deep-ensemble-d", build), {"heads": str(p.heads)})


def _mc_dropout(p: Pieces) -> Built:
    """The single model sampled with its dropout on, or, when it has none, a model trained as it with dropout."""
    samples, model = p.task.mc_samples, p.single()
    if p.task.dropout_model is not None:
        model = p.trained(f"single-dropout{p.seed}", *p.from_start(p.seed, dropout=True))
    return Built(MCDropout(model, samples=samples, seed=p.seed), {"heads": str(p.heads), "samples": samples})


def _single_as_long(p: Pieces) -> Built:
    """The control for extra training: the single model fine-tuned again, unpruned, with the recipe and the
    epochs of the pruned models, so that what pruning does is told apart from what more training does."""

    def build() -> nn.Module:
        return p.fine_tuned(copy.deepcopy(p.single()), "single-long", p.seed * 100 + 99)

    return Built(p.trained("single-long", build, checkpoint="single-long"), {"heads": str(p.heads)})


def _temperature(p: Pieces, row: Callable[[Pieces], Built] | None = None) -> Built:
    """`row`'s predictor (Single when None) with one temperature fitted on the ID validation NLL (Guo et al.,
    2017): the calibration a user adds with `hydra-ens calibrate`, so that a row is compared calibrated with
    Single calibrated the same way."""
    built = row(p) if row else Built(p.single(), {"heads": str(p.heads)})
    temperature = fit_temperature(collect_member_logits(built.predictor, p.task.val), labels_of(p.task.val))
    scaled = Calibrated(built.predictor, TemperatureScaling(temperature))
    return Built(scaled, built.extra | {"temperature": temperature})


def _lora(p: Pieces) -> Built:
    task, seeds = p.task, [p.seed * 100 + m for m in range(p.task.members)]

    def build() -> nn.Module:
        base = p.single() if task.lora_from_single else task.new_model(p.seed).to(p.device)
        return lora_ensemble(base, task.train, task.lora_recipe, seeds, progress=p.progress)

    return Built(p.trained("lora", build), {"heads": f"{p.heads}x{task.members}"})


def _batch_ensemble(p: Pieces) -> Built:
    """BatchEnsemble (Wen et al., 2020) as paper 000 §C.1.4 builds it: applied to the trained checkpoint (here the
    seed's single model; fast weights N(1, 0.5) drawn from the seed), then fine-tuned as one module with the
    members' recipe (`finetune_fused`: each member's cross-entropy, summed; the embeddings frozen when the recipe
    freezes them)."""

    def build() -> nn.Module:
        ensemble = batch_ensemble(p.single(), members=p.task.members, seed=p.seed)
        return p.fine_tuned(ensemble, "batch-ensemble", p.seed, train=finetune_fused)

    return Built(p.trained("batch-ensemble", build, checkpoint="batch-ensemble"), {"heads": str(p.heads)})


def _from_scratch(p: Pieces, row: str) -> None:
    """Refuse a row the paper trains from scratch (§C.1.4) on a task whose Single is fine-tuned from a pretrained
    model: its rows would compare a network trained on the task alone with pretrained ones."""
    if not getattr(p.task, "from_scratch", False):
        raise ValueError(
            f"the {row!r} row trains from scratch (paper 000 §C.1.4, without its ImageNet-21k pretraining) and "
            f"belongs next to a Single trained from scratch; task {p.task.name!r} fine-tunes a pretrained model. "
            "Run it on image-fmnist."
        )


def _packed(p: Pieces) -> Built:
    """Packed-Ensembles (E = M, alpha = 2, gamma = 1; §C.1.4): M narrow transformers from the seed, trained from
    scratch as one fused module with Single's recipe (epochs, lr, the best validation epoch kept)."""
    _from_scratch(p, "Packed-Ensembles")
    task, seed, members = p.task, p.seed, p.task.members

    def build() -> nn.Module:
        packed = packed_ensemble(task.new_model(seed), members=members, alpha=2.0, seed=seed * 100 + 70)
        directory = p.cache / "checkpoints" / "packed"
        recipe = task.recipe.with_(seed=seed)
        packed = packed.to(p.device)
        return train_packed(
            packed, task.train, recipe, val_loader=task.val, checkpoint_dir=directory, progress=p.progress
        )

    packed = p.trained("packed", build, checkpoint="packed")
    heads = packed.fused.head_maps[0][0]
    return Built(packed, {"heads": f"{len(heads)}x{members} (alpha 2)"})


def _mimo(p: Pieces) -> Built:
    """MIMO (E = M, rho = 0.5, batch repetition 4; §C.1.4): trained from scratch with Single's recipe (epochs, lr,
    the best validation epoch kept)."""
    _from_scratch(p, "MIMO")
    task, seed = p.task, p.seed

    def build() -> nn.Module:
        network = mimo(task.new_model(seed), members=task.members, rho=0.5, batch_repetition=4, seed=seed * 100 + 80)
        directory = p.cache / "checkpoints" / "mimo"
        recipe = task.recipe.with_(seed=seed)
        network = network.to(p.device)
        return train_mimo(
            network, task.train, recipe, val_loader=task.val, checkpoint_dir=directory, progress=p.progress
        )

    return Built(p.trained("mimo", build, checkpoint="mimo"), {"heads": str(p.heads)})


def _oba(p: Pieces) -> Built:
    """OBA (Sun et al., 2025), paper 000's unstructured pruning baseline: from the seed's single model, as many
    Linear weights removed as the pruned rows' heads hold (the paper matches the parameters the same way: 89.1 %
    kept on ViT-B/16), by `oba_prune` in `OBA_STEPS` rounds on the calibration data, then fine-tuned with the
    members' recipe (§D.2: one recipe whatever the pruning), the removed weights held at zero. Its cost is Single's:
    nothing here skips zero weights. The masks are kept with the training checkpoint, so a resumed fine-tuning does
    not prune again."""
    name, single = f"oba{OBA_STEPS}", p.single()
    shorter = prune_heads(copy.deepcopy(single), {layer: range(p.task.prune_per_layer) for layer in range(p.layers)})
    remove = sum(w.numel() for w in linear_parameters(single).values())
    remove -= sum(w.numel() for w in linear_parameters(shorter).values())

    def build() -> nn.Module:
        model, path = copy.deepcopy(single), p.cache / "checkpoints" / name / "masks.pt"  # weights-sized: no record
        if path.exists():
            mask_weights(model, torch.load(path))
        else:
            torch_save_atomic(oba_prune(model, p.calibration, remove, steps=OBA_STEPS, progress=p.progress), path)
        return p.fine_tuned(model, name, p.seed * 100 + 60)

    kept = 100 * (1 - remove / sum(w.numel() for w in single.parameters()))
    return Built(p.trained(name, build, checkpoint=name), {"heads": f"{p.heads} ({kept:.1f} % of weights)"})


def _taylor_pruned(p: Pieces, budget: int, fine_tune: bool) -> nn.Module:
    """One model without the `budget` lowest sequential Taylor scores of each layer."""
    head_map = sample_members(p.taylor_scores(budget), num_members=1, budget=budget, pool=budget)[0]
    return p.fine_tuned_members("taylor", [head_map], fine_tune)[0]


def _circuit_pruned(p: Pieces, budget: int, fine_tune: bool, criterion: str = "avg") -> nn.Module:
    """One model without the first `budget` x layers heads of the `criterion` circuit."""
    head_map = p.circuit(criterion).head_map(budget * p.layers)
    return p.fine_tuned_members(f"circ{criterion}", [head_map], fine_tune)[0]


def _taylor(p: Pieces, fine_tune: bool = True) -> Built:
    budget = p.task.prune_per_layer
    return Built(_taylor_pruned(p, budget, fine_tune), {"heads": str(p.heads - budget)})


def _circuit(p: Pieces, criterion: str, fine_tune: bool = True) -> Built:
    budget = p.task.prune_per_layer
    # CircAvg's search is the table's "circuit_search" (the Hydra rows' circuit); the others' under their criterion
    key = "circuit_search" if criterion == "avg" else f"circuit_search_{criterion}"
    recorded = {"heads": f"{p.heads - budget} (avg)", key: _search(p.circuit(criterion))}
    return Built(_circuit_pruned(p, budget, fine_tune, criterion), recorded)


def _hydra_taylor(p: Pieces, mlp: str) -> Built:
    task = p.task
    head_maps = sample_members(
        p.taylor_scores(), num_members=task.members, budget=task.prune_per_layer, pool=task.taylor_pool, seed=p.seed
    )
    heads = f"{p.heads - task.prune_per_layer}x{task.members}"
    return _fused(p.fine_tuned_members("hydra-taylor", head_maps), mlp, {"heads": heads, **_members(head_maps, p)})


def _circ_members(p: Pieces, trunk: int = 0) -> tuple[list[dict[int, list[int]]], dict]:
    """Hydra (Circ)'s members' head maps (drawn from the CircAvg circuit's pool; identical in their first `trunk`
    layers, `sample_members`) and what its rows record of them."""
    task, circuit = p.task, p.circuit()
    budget = task.prune_per_layer * p.layers
    head_maps = sample_members(
        circuit, num_members=task.members, budget=budget, pool=task.circuit_pool, seed=p.seed, trunk=trunk
    )
    heads = f"{p.heads - task.prune_per_layer}x{task.members} (avg)"
    return head_maps, {"heads": heads, **_members(head_maps, p), "circuit_search": _search(circuit)}


def _hydra_circ(p: Pieces, mlp: str, fine_tune: bool = True) -> Built:
    head_maps, recorded = _circ_members(p)
    return _fused(p.fine_tuned_members("hydra-circ", head_maps, fine_tune), mlp, recorded)


def _hydra_circ_fused_first(p: Pieces, trunk: float = 0.0) -> Built:
    """Hydra (Circ)'s members pruned and fused (exact: unfine-tuned members share their MLPs), then fine-tuned as
    one module (`finetune_fused`, paper 000 Fig. 1) with the members' recipe: the merged MLP, norms and
    classifier-side layers learn from every member's loss (the embeddings frozen when the recipe freezes them).

    `trunk`: the fraction of the layers (rounded, at least 1, at most all but the last) in which the members are
    identical (CircAvg's heads; the rest of each member's budget drawn from the circuit's pool in the later layers):
    fused, those layers are one copy, run once and trained on every member's loss, a cheaper ensemble on the same
    base (issue 44)."""
    shared = min(max(round(trunk * p.layers), 1), p.layers - 1) if trunk else 0
    head_maps, recorded = _circ_members(p, shared)
    name = f"hydra-circ-fused-{_digest(head_maps[0])}" + (f"-trunk{shared}" if shared else "")

    def build() -> nn.Module:
        ensemble = HydraEnsemble.fuse(build_members(p.single(), head_maps), mlp="average")
        return p.fine_tuned(ensemble, name, p.seed, train=finetune_fused)

    ensemble = p.trained(name, build, checkpoint=name)
    if ensemble.head_maps != head_maps:  # the name digests member 0's map alone (kept: it names the caches made)
        raise RuntimeError(
            f"the ensemble cached as {p.cache / 'models' / name} has other members' head maps than this run draws "
            "(the circuit or its pool changed): delete that folder to fine-tune this run's members."
        )
    return _ensemble_row(ensemble, "average", recorded | ({"trunk": ensemble.trunk} if shared else {}))


def _fused(members: list[nn.Module], mlp: str, recorded: dict) -> Built:
    return _ensemble_row(HydraEnsemble.fuse(members, mlp=mlp), mlp, recorded)


def _ensemble_row(ensemble: HydraEnsemble, mlp: str, recorded: dict) -> Built:
    return Built(ensemble, recorded | {"mlp": mlp, "averaged": len(ensemble.averaged)})


BUILDS: dict[str, Callable[[Pieces], Built]] = {
    "Single": _single,
    "Single, trained as long": _single_as_long,
    "Deep Ensembles": _deep_ensemble,
    "Deep Ensembles (D)": _deep_ensemble_d,
    "MC Dropout": _mc_dropout,
    "Temp. scaling": _temperature,
    "LoRA Ens.": _lora,
    "Taylor": _taylor,
    "CircAvg": partial(_circuit, criterion="avg"),
    "Hydra (Taylor)": partial(_hydra_taylor, mlp="average"),
    "Hydra (Circ)": partial(_hydra_circ, mlp="average"),
    "Hydra (Taylor), stacked MLP": partial(_hydra_taylor, mlp="stack"),
    "Hydra (Circ), stacked MLP": partial(_hydra_circ, mlp="stack"),
    "Hydra (Circ), fused then fine-tuned": _hydra_circ_fused_first,
    "Hydra (Circ), temp. scaling": partial(_temperature, row=partial(_hydra_circ, mlp="average")),
    # the reviewers' rows
    "Taylor, no fine-tuning": partial(_taylor, fine_tune=False),
    "CircAvg, no fine-tuning": partial(_circuit, criterion="avg", fine_tune=False),
    "Hydra (Circ), no fine-tuning": partial(_hydra_circ, mlp="average", fine_tune=False),
    "CircAcc": partial(_circuit, criterion="acc"),
    "CircOOD": partial(_circuit, criterion="ood"),
    # the paper's efficient ensembles (Table 1), after the rows above so that the main table stays as it was
    "BatchEnsemble": _batch_ensemble,
    "Packed-Ensembles": _packed,
    "MIMO": _mimo,
    "OBA": _oba,  # the paper's unstructured pruning baseline
    # cheaper ensembles on the same base (issue 44): members identical in their first layers, run once
    "Hydra (Circ), shared trunk 1/2": partial(_hydra_circ_fused_first, trunk=1 / 2),
    "Hydra (Circ), shared trunk 3/4": partial(_hydra_circ_fused_first, trunk=3 / 4),
    "CircAvg, temp. scaling": partial(_temperature, row=partial(_circuit, criterion="avg")),
    ENGINE: _single_fused,  # the cost columns' engine-matched reference (issue 44)
}
ALL_ROWS = tuple(BUILDS)
FROM_SCRATCH_ROWS = ("Packed-Ensembles", "MIMO")  # refused unless the task's Single is trained from scratch
TRUNK_ROWS = ("Hydra (Circ), shared trunk 1/2", "Hydra (Circ), shared trunk 3/4")
ROWS, REVIEW_ROWS = ALL_ROWS[:15], ALL_ROWS[15:]


def _search(circuit: Circuit) -> str:
    """How a circuit was ranked, as the tables say it: the search, why it is an approximation, and its ties."""
    said = circuit.search + (f" ({circuit.note})" if circuit.note else "")
    return said + (f" — {circuit.tie_note()}" if circuit.tie_note() else "")


def circuit_removals(task, layers: int) -> int:
    """How many heads a task's CircAvg circuit ranks (`Pieces.circuit`): enough for Hydra (Circ)'s pool and for
    CircAvg's budget of `prune_per_layer` heads in each of `layers` layers."""
    return max(task.circuit_pool, task.prune_per_layer * layers)


def _members(head_maps: Sequence[Mapping[int, Sequence[int]]], p: Pieces) -> dict:
    """What a Hydra row records of its members: their head maps and the mean pairwise Jaccard of their pruned heads."""
    return {"head_maps": _recorded(head_maps), "overlap": head_map_overlap(head_maps, p.heads).mean}


def _recorded(head_maps: Sequence[Mapping[int, Sequence[int]]]) -> list[dict[str, list[int]]]:
    """Head maps as a results file holds them (JSON keys are strings), whether rendered now or from records."""
    return [{str(layer): list(heads) for layer, heads in head_map.items()} for head_map in head_maps]


def _digest(head_map: Mapping[int, Sequence[int]]) -> str:
    text = json.dumps({str(layer): sorted(heads) for layer, heads in sorted(head_map.items())})
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def circuit_searches(per_seed: Mapping[int, Mapping[str, dict]]) -> dict[str, str]:
    """{seed: the search that ranked its CircAvg circuit}, as the rows built on that circuit recorded it."""
    said = {
        seed: [r["circuit_search"] for r in rows.values() if "circuit_search" in r] for seed, rows in per_seed.items()
    }
    return {str(seed): searches[0] for seed, searches in said.items() if searches}


def figures(task, summary: dict, seed_cache: Path, out_dir: Path) -> None:
    """Reliability diagrams, MSP histograms (ID / near / far) and Taylor / circuit head heatmaps of one seed."""
    paths = {row: row_file(seed_cache / "logits", row) for row in PLOTTED}
    logits = {row: torch.load(path) for row, path in paths.items() if path.exists()}
    if logits:  # none when the seed's rows came from records without their logits: the figures are left as they are
        plots.logit_figures(logits, labels_of(task.test), out_dir, task.name)
    maps = {}
    if (seed_cache / "taylor_scores_sequential.pt").exists():
        maps["Taylor score (sequential)"] = torch.load(seed_cache / "taylor_scores_sequential.pt")
    if (seed_cache / "circuit_avg.json").exists():
        maps["CircAvg removal step (late = useful)"] = Circuit.load(seed_cache / "circuit_avg.json").removal_steps()
    if maps:
        plots.head_heatmap(maps, out_dir / "head_importance.png", title=f"{task.name}: head importance")


def cached_row(task, seed: int, cache: Path, row: str, device: torch.device = runner.CPU) -> Built:
    """The row `row` of one seed as the benchmark cached it (`cache`: the seed's `runner.seed_dir`), from the cache
    alone: nothing is trained, searched or recorded; `NotTrained` names the first thing missing."""
    if row not in BUILDS:
        raise ValueError(f"unknown row {row!r}; choose from {list(BUILDS)}.")
    return BUILDS[row](Pieces(SeedRun(task, seed, Path(cache), progress=False, device=device), cache_only=True))


# ---- the table ----


def disagreement_lines(rows: Mapping[str, dict]) -> list[str]:
    """Members' disagreement on the test set, run one by one (the stacked-MLP fusion is exact) and fused with the
    merged MLP: does averaging the MLPs make the members agree?"""
    pairs = [(fused, f"{fused}, stacked MLP") for fused in ("Hydra (Taylor)", "Hydra (Circ)")]
    pairs = [pair for pair in pairs if all("id.disagreement" in rows.get(row, {}) for row in pair)]
    header = ["Members", "disagreement one by one", "after fusion", "MI one by one", "after fusion"]
    body = [
        [fused]
        + [f"{100 * rows[r]['id.disagreement']['mean']:.1f} %" for r in (separate, fused)]
        + [f"{rows[r]['id.mi']['mean']:.4f}" for r in (separate, fused)]
        for fused, separate in pairs
    ]
    said = (
        "Members' disagreement on the test set (mean over seeds): the fraction of member pairs whose top-1 classes "
        "differ, and the mean mutual information (nats), for the members run one by one (= stacked MLP, exact) and "
        "after fusion with the merged MLP:"
    )
    return ["", said, "", *render(header, body, "markdown")] if pairs else []


def members_lines(summary: dict) -> list[str]:
    """Each Hydra row's members, mean over seeds: the overlap of their pruned heads, their disagreement and mutual
    information on the test set. Only rows that recorded their overlap (none recorded before it was): older tables
    render as they were."""
    body = []
    for row, stats in summary["rows"].items():
        ran = [results[row] for results in summary["per_seed"].values() if row in results]
        overlaps = [result["overlap"] for result in ran if "overlap" in result]
        if not overlaps:
            continue
        partly = f" ({len(overlaps)} of {len(ran)} seeds)" if len(overlaps) < len(ran) else ""
        disagreement, mi = stats.get("id.disagreement"), stats.get("id.mi")
        measured = [f"{100 * disagreement['mean']:.1f} %" if disagreement else "–", f"{mi['mean']:.4f}" if mi else "–"]
        body.append([row, f"{statistics.fmean(overlaps):.2f}{partly}", *measured])
    said = (
        "Members of each Hydra row (mean over seeds): overlap, the mean pairwise Jaccard index of the heads they prune "
        "(1: identical members, 0: no head pruned by two); disagreement, the fraction of member pairs whose top-1 "
        "classes differ on the test set; MI, the mean mutual information (nats):"
    )
    return ["", said, "", *render(["Hydra row", "overlap", "disagreement", "MI"], body, "markdown")] if body else []


MEASURED_ON = "Rows (seed, row) measured on:"  # the line that says so starts with this


def measured_on_lines(summary: dict) -> list[str]:
    """Where the rows were measured, when that is not only the machine of this run."""
    machines = summary.get("measured_on", {})
    if list(machines) in ([], [summary["machine"]]):
        return []
    return [f"{MEASURED_ON} " + "; ".join(f"{where} ({n})" for where, n in machines.items()) + "  "]


DIFFERENCES = (  # (A, B): is A really better than B? Paper rows against the baselines, and the controls
    ("Hydra (Circ)", "Single"),
    ("Hydra (Taylor)", "Single"),
    ("Hydra (Circ)", "Deep Ensembles"),
    ("Hydra (Taylor)", "Deep Ensembles"),
    ("CircAvg", "Single"),
    ("CircAvg", "Deep Ensembles"),
    ("Deep Ensembles", "Single"),
    ("Hydra (Circ)", "Hydra (Taylor)"),  # which of the paper's two importances makes the better members
    ("Hydra (Circ)", "Single, trained as long"),
    ("Hydra (Taylor)", "Single, trained as long"),
    ("CircAvg", "Single, trained as long"),  # pruning, apart from the members' extra training
    ("Single, trained as long", "Single"),  # what the extra training alone gives
    ("Hydra (Circ), temp. scaling", "Deep Ensembles"),  # calibrated, against the ensemble a user would train
    ("Hydra (Circ), temp. scaling", "Temp. scaling"),
    ("CircAvg, temp. scaling", "Temp. scaling"),
    ("CircAvg, temp. scaling", "Single"),  # issue 44: one model's cost, better than the model a user has?
    ("Hydra (Circ), stacked MLP", "Hydra (Circ)"),  # issue 39 item 5: is the averaged MLP what loses?
    ("Hydra (Circ), fused then fine-tuned", "Hydra (Circ)"),  # fine-tune after fusing, or before?
    ("Hydra (Circ)", "BatchEnsemble"),  # the paper's efficient ensembles (Table 1)
    ("Hydra (Circ)", "Packed-Ensembles"),
    ("Hydra (Circ)", "MIMO"),
    ("Hydra (Circ)", "OBA"),  # the paper's unstructured pruning baseline
    ("CircAvg", "OBA"),  # structured pruning by the circuit, or pruning and fine-tuning as such?
    ("OBA", "Single"),
    ("OBA", "Single, trained as long"),
)


OBA_NOTE = (
    f"- OBA (Sun et al., 2025; paper 000's unstructured pruning baseline): as many Linear weights removed from Single "
    "as the pruned rows' heads hold (the share kept is in its heads column), ranked by theta_i (H theta)_i, the exact "
    f"Hessian-vector product on the calibration data, in {OBA_STEPS} rounds (the authors' code: 49), then "
    "fine-tuned with the members' recipe, the removed weights held at zero. Its FLOPs and latency are Single's: "
    "nothing here skips zero weights."
)


def member_ood(task, summary: dict, seed_dirs: Mapping[int, Path]) -> dict:
    """{"member_ood": {row: {"ensemble": [per seed], "members": [per seed: [per member]]}}}: the all-OOD AUROC
    (the table's: maximum softmax probability, mean over the OOD sets) of each ensemble row's prediction and of each
    of its members alone, from the logits every seed holds; {} when no row has them. Does averaging the members
    detect OOD inputs better than the members do? (If not, an ensemble cannot inherit its members' OOD gain.)"""
    labels, said = labels_of(task.test), {}
    for row in summary["rows"]:
        per_seed = list(recorded_logits(seed_dirs, row).values())
        if len(per_seed) < len(seed_dirs):
            continue
        count = per_seed[0]["test"].shape[1] if per_seed[0]["test"].dim() == 3 else 1
        if count < 2:
            continue
        said[row] = {
            "ensemble": [all_ood_auroc(logits, labels) for logits in per_seed],
            "members": [[all_ood_auroc(logits, labels, slice(m, m + 1)) for m in range(count)] for logits in per_seed],
        }
    return {"member_ood": said} if said else {}


def recorded_logits(seed_dirs: Mapping[int, Path], row: str) -> dict[int, dict]:
    """{seed: `row`'s saved logits} (`report.measure`'s) of the seeds whose directory holds them."""
    paths = {seed: row_file(Path(folder) / "logits", row) for seed, folder in seed_dirs.items()}
    return {seed: torch.load(path) for seed, path in paths.items() if path.exists()}


def members_of(logits: Mapping, members: slice) -> dict:
    """A row's saved logits ({"test": (N, M, C), group: {set: (N_k, M, C)}}, `report.measure`'s) kept to `members`,
    a slice of the M axis: as if those members were the row."""
    return {"test": logits["test"][:, members]} | {
        group: {name: x[:, members] for name, x in logits.get(group, {}).items()} for group in GROUPS
    }


def all_ood_auroc(
    logits: Mapping, labels: Tensor, members: slice = slice(None), score: str | Callable[[Tensor], Tensor] = "msp"
) -> float:
    """All-OOD AUROC (the tables' column: each OOD set against the test set, averaged over the sets) of `members`
    of a row's saved logits, by `score`: a name in `evaluation.ood.OOD_SCORES` (default: the maximum softmax
    probability of their mean prediction) or a function of member logits (N, M, C) -> (N,), higher = more OOD."""
    kept = members_of(logits, members)
    test, near, far, ood = kept["test"], kept["near"], kept["far"], kept["ood"]
    if isinstance(score, str):
        return evaluate(test, labels, near, far, score=score, ood=ood)["all"]["auroc"]
    scored = {name: score(x) for group in (near, far, ood) for name, x in group.items()}
    return evaluate(test, labels, near, far, ood=ood, id_scores=score(test), ood_scores=scored)["all"]["auroc"]


GROUPS = ("near", "far", "ood")  # the groups of OOD sets a row's logits file holds (`report.measure`)


def member_ood_lines(summary: dict) -> list[str]:
    """`member_ood` as markdown: each ensemble row's all-OOD AUROC beside its members' alone, mean over seeds."""
    said = summary.get("member_ood")
    if not said:
        return []
    body = []
    for row, auroc in said.items():
        alone = [value for seed in auroc["members"] for value in seed]
        body.append(
            [
                row,
                f"{100 * statistics.fmean(auroc['ensemble']):.1f}",
                f"{100 * statistics.fmean(alone):.1f}",
                f"{100 * min(alone):.1f}-{100 * max(alone):.1f}",
            ]
        )
    said_line = (
        "OOD detection by each ensemble and by its members alone (all-OOD AUROC %, maximum softmax probability of "
        "the prediction, mean over seeds; members: every member of every seed): an ensemble below its members loses "
        "by averaging what its members detect:"
    )
    header = ["Ensemble", "ensemble", "members alone (mean)", "members alone (min-max)"]
    return ["", said_line, "", *render(header, body, "markdown")]


def training(task, summary: dict, seed_dirs: Mapping[int, Path]) -> dict:
    """{"training": {seed: {model: {"epochs", "kept", "val_nll"}}}}: how long each model a seed cached was trained
    (`TRAINING`): epochs run, the epoch kept and its validation NLL, by the model's cache name without the seed
    and head-map digests that tell seeds apart. A model that kept its last allowed epoch was still improving; one
    that ran fewer epochs than allowed stopped early. {} when no seed recorded any."""
    said = {}
    for seed, folder in seed_dirs.items():
        recorded = read_json_record(Path(folder) / TRAINING)
        said[str(seed)] = {_model_kind(name): _training_of(record) for name, record in recorded.items()}
    return {"training": said} if any(said.values()) else {}


def _model_kind(name: str) -> str:
    """A cached model's name as every seed shares it: "start1-2" -> "start-2", "single-dropout2" ->
    "single-dropout", "hydra-circ0-1d5aeb22" -> "hydra-circ0" (the seed and the head map's digest dropped)."""
    name = re.sub(r"^(start|single-dropout)\d+", r"\1", name)
    return re.sub(r"-[0-9a-f]{8}(?=-|,|$)", "", name)  # ",": "…, rebuilt" (`Pieces._record_training`)


def _training_of(record: Mapping) -> dict:
    kept = record["kept_epoch"]
    epochs = {epoch["epoch"]: epoch for epoch in record["epochs"]}
    return {"epochs": len(epochs), "kept": kept, "val_nll": epochs.get(kept, {}).get("val_nll")}


def training_lines(summary: dict) -> list[str]:
    """`training` as markdown: one line per model, one column per seed."""
    said = summary.get("training")
    if not said:
        return []
    seeds, models = list(said), {model for seed in said.values() for model in seed}
    models = sorted(models, key=lambda model: (not model.startswith("single"), not model.startswith("start"), model))

    def cell(record: Mapping | None) -> str:
        if record is None:
            return "–"
        nll = "" if record["val_nll"] is None else f", {record['val_nll']:.3f}"
        return f"{record['epochs']} / {record['kept']}{nll}"

    body = [[model, *(cell(said[seed].get(model)) for seed in seeds)] for model in models]
    line = (
        "Training of every model the seeds cached: epochs run / the epoch kept, and its validation NLL (single: "
        "Single; single-long: Single, trained as long; start-k: the deep ensemble's member k + 1; taylor0, circavg0: "
        "the Taylor and CircAvg models; hydra-…m: member m of that Hydra row; hydra-circ-fused: fused then "
        "fine-tuned; …, rebuilt: the model trained again on another machine to other weights, the rows the notes "
        "name built on it; the allowed epochs are in the notes above). A model that kept its last allowed epoch "
        "was still improving when its budget ended; one that ran fewer stopped early:"
    )
    return ["", line, "", *render(["Model", *(f"seed {seed}" for seed in seeds)], body, "markdown")]


def differences(task, summary: dict, seed_dirs: Mapping[int, Path]) -> dict:
    """{"differences": `bootstrap.row_differences`} of the `DIFFERENCES` pairs this table holds, from every seed's
    logits; {} when none has them (records kept before logits were): the table renders as it did. A seed whose two
    rows were made from different builds of its single model compares them on one build where it can
    (`records.same_build_stand_ins`); the pair keeps the seeds where it cannot, as "builds_apart"."""
    pairs = [pair for pair in DIFFERENCES if all(row in summary["rows"] for row in pair)]
    stand_ins, apart = same_build_stand_ins(seed_dirs, pairs, independent=FROM_SCRATCH_ROWS)
    said = row_differences(seed_dirs, labels_of(task.test), pairs, stand_ins=stand_ins) if pairs else {}
    for pair in said.get("pairs", []):
        if (rows := tuple(pair["rows"])) in apart:
            pair["builds_apart"] = apart[rows]
    return {"differences": said} if said else {}


def differences_lines(summary: dict) -> list[str]:
    return ["", *difference_lines(summary["differences"])] if summary.get("differences") else []


def latency_lines(summary: Mapping) -> list[str]:
    """The header line saying on what batch, when and where the latency column was timed; none when untimed."""
    if not summary.get("latency_timed"):
        return []
    return [f"Latency: batch of {summary.get('latency_batch')}, {_timed_where(summary)}  "]


def _timed_where(summary: dict) -> str:
    """When and where the latency column was timed: one seed's models, or each timed seed's (a spread over seeds
    timed on different machines holds the machines' difference too: said)."""
    timed = runner.timings(summary)
    if len(timed) == 1:
        when = next(iter(timed.values()))
        return f"timed {when['date']} on {runner.timed_on(when)}"
    said = "; ".join(f"seed {seed} {when['date']} on {runner.timed_on(when)}" for seed, when in timed.items())
    machines = {runner.timed_on(when) for when in timed.values()}
    mixed = ", so its spread over seeds holds the machines' difference too" if len(machines) > 1 else ""
    return f"each seed's models timed on its own ({said}){mixed}"


def markdown(summary: dict) -> str:
    one = len(summary["seeds"]) == 1
    lines = [
        f"# {summary['task']}: Hydra Ensembles vs baselines",
        "",
        f"Command: `{summary['command']}`  ",
        f"Machine (this run): {summary['machine']}  ",
        *measured_on_lines(summary),
        f"Seeds: {summary['seeds']} "
        + ("(one run: values without a spread)  " if one else "(mean ± std over seeds)  "),
        f"Wall time: {summary['wall_time_s'] / 60:.1f} min for this run (training compute recorded over all "
        f"runs that filled the cache: {summary['compute_s'] / 60:.1f} min)",
        *latency_lines(summary),
        "",
        *table_lines(summary["rows"], summary.get("latency")),
        "",
        CONVENTIONS,
        "",
        *(f"- {note}" for note in summary["notes"]),
        "- Hydra (Taylor) and Hydra (Circ) are the paper's method: sequential Taylor scores, circuits by greedy "
        "removal (the search below), members fine-tuned and fused with the merged (averaged) MLP. The rows '…, "
        "stacked MLP' fuse the same members keeping each one's own MLP (exact, more parameters).",
    ]
    if "OBA" in summary["rows"]:
        lines.append(OBA_NOTE)
    if summary.get("circuit_search"):
        searches = "; ".join(f"seed {seed}: {search}" for seed, search in summary["circuit_search"].items())
        lines.append(f"- Circuit search (CircAvg ranking): {searches}.")
    lines += differences_lines(summary)
    lines += ["", "Per OOD set (AUROC %, mean over seeds):", ""]
    lines += per_set_lines(summary["per_seed"], summary.get("ood_sets"))
    lines += disagreement_lines(summary["rows"]) + members_lines(summary) + member_ood_lines(summary)
    lines += training_lines(summary)
    return "\n".join(lines) + "\n"


TABLE = Table(
    rows=runner.fixed(BUILDS),
    pieces=Pieces,
    markdown=markdown,
    default=ROWS,
    summarize=lambda task, summary, seed_dirs: {
        "circuit_search": circuit_searches(summary["per_seed"]),
        **differences(task, summary, seed_dirs),
        **member_ood(task, summary, seed_dirs),
        **training(task, summary, seed_dirs),
    },
    figures=figures,
)


# ---- Figures 5-6: the number of heads pruned ----

SWEEP_COLUMNS = [column for column in COLUMNS if column.header in ("Acc", "AUROC all", "FPR95 all")]


def head_sweep(
    task,
    seeds: list[int],
    budgets: list[int],
    out_dir: Path,
    cache_dir: Path,
    command: str = "",
    progress: bool = True,
    device: torch.device = runner.CPU,
) -> dict:
    """Paper §B.3, Figures 5-6: Taylor and CircAvg models pruning b heads per layer, for each b in `budgets`,
    without fine-tuning (Fig. 5) and fine-tuned (Fig. 6), against Single. Shares the table's cache (the single
    model, the CircAvg circuit, any pruned model the table trained). Writes sweep.md, sweep.json and
    head_sweep.png to `out_dir`."""
    for seed in seeds:
        _check_budgets(Pieces(SeedRun(task, seed, runner.seed_dir(cache_dir, task, seed), device=device)), budgets)
    rows = {"Single": _single}
    for budget in budgets:
        for method, pruned in (("Taylor", _taylor_pruned), ("CircAvg", _circuit_pruned)):
            for stage in ("zero-shot", "fine-tuned"):
                tuned = partial(pruned, budget=budget, fine_tune=stage == "fine-tuned")
                rows[f"{method}, {budget} pruned/layer, {stage}"] = partial(_sweep_row, tuned, budget)
    table = Table(
        rows=runner.fixed(rows),
        pieces=Pieces,
        markdown=sweep_markdown,
        output="sweep",
        record="sweep.json",
        logits="sweep-logits",
        summarize=lambda task, summary, seed_dirs: {
            "budgets": list(budgets),
            "notes": [note for seed, folder in seed_dirs.items() for note in rebuilt_notes(seed, folder)],
        },
        figures=lambda task, summary, seed_cache, out: plots.sweep_figure(summary, out / "head_sweep.png"),
    )
    return runner.run(
        task, table, seeds, out_dir, cache_dir, command=command, latency_repeats=0, progress=progress, device=device
    )


def _sweep_row(pruned: Callable[[Pieces], nn.Module], budget: int, p: Pieces) -> Built:
    return Built(pruned(p), {"heads": f"{budget} pruned/layer"})


def _check_budgets(pieces: Pieces, budgets: Sequence[int]) -> None:
    ranked = circuit_removals(pieces.task, pieces.layers)  # what `circuit` extracts
    for budget in budgets:
        if not 0 < budget < pieces.heads:
            raise ValueError(f"budgets must be between 1 and {pieces.heads - 1} heads per layer, got {budget}.")
        if budget * pieces.layers > ranked:
            raise ValueError(
                f"a budget of {budget} heads per layer needs {budget * pieces.layers} heads of the CircAvg circuit, "
                f"which ranks {ranked} (the task's circuit_pool): use budgets up to {ranked // pieces.layers}."
            )


def sweep_markdown(summary: dict) -> str:
    header = ["Model", *(column.header for column in SWEEP_COLUMNS), "Params (M)"]
    body = [
        [row, *(mean_std(stats.get(f"{c.where}.{c.key}"), c.scale, c.digits) for c in SWEEP_COLUMNS)]
        + [f"{stats['params']['mean'] / 1e6:.2f}"]
        for row, stats in summary["rows"].items()
    ]
    lines = [
        f"# {summary['task']}: pruning b heads per layer (paper Figures 5-6)",
        "",
        f"Command: `{summary['command']}`  ",
        f"Machine: {summary['machine']}  ",
        f"Seeds: {summary['seeds']}; budgets (heads pruned per layer): {summary['budgets']}  ",
        f"Wall time: {summary['wall_time_s'] / 60:.1f} min for this run",
        "",
        *render(header, body, "markdown"),
        "",
        "Taylor: sequential Taylor scores computed for each budget; CircAvg: the first b x layers heads of the "
        "CircAvg circuit. Zero-shot: pruned and evaluated as is; fine-tuned: the task's recipe for pruned models. "
        "Values in %, mean ± std over seeds; OOD by maximum softmax probability, OOD = positive.",
        *(f"\n{note}" for note in summary.get("notes", [])),
    ]
    return "\n".join(lines) + "\n"


def _build_keys(name: str) -> Iterator[str]:
    """The `TRAINING` keys of the builds of `name`, first to last: "<name>", "<name>, rebuilt", "<name>, rebuilt 2"…"""
    return itertools.chain((name, f"{name}, rebuilt"), (f"{name}, rebuilt {k}" for k in itertools.count(2)))
