"""The one training loop: seeded, checkpointed every epoch (and every 10 minutes within one), resumable,
data-parallel under torchrun.

It takes the loss and the forward as arguments: fine-tuning (`finetune`: cross-entropy on the model's logits),
distillation from a teacher's outputs (`losses.DistillKL`, `losses.GaussianKL`: `hydra_ensembles.distill`), and
feature matching are the same loop with another loss. It trains HF models, fused ensembles (a distillation
student) and plain modules (an MLP) alike. Each step: `output = forward(model, inputs)`,
`loss(output, batch).backward()`, clip, step, schedule.

Under `torchrun --nproc-per-node N` the model is wrapped in DistributedDataParallel and each rank takes every
N-th example of each batch, so a step averages the gradient over the whole batch, as one process would; every
rank keeps and stops at the epochs rank 0's validation numbers choose.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
import warnings
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..adapters import Adapter, get_adapter
from ..data.loaders import Batch, materialize, per_example, split_batch, to_device
from ..data.loaders import batch_size as examples_in
from ..distributed import (
    barrier,
    check_same_on_every_rank,
    from_main,
    is_distributed,
    is_main,
    rank,
    sum_over_ranks,
    world_size,
)
from ..fusion import HydraEnsemble
from ..io import batches_digest, torch_save_atomic, weights_digest
from ..metrics import accuracy, gaussian_mixture_nll, nll
from ..outputs import collect_member_logits, labels_of, member_outputs_of
from ..precision import warn_if_emulated_bf16
from ..uncertainty import ensemble_probs
from .augment import AUGMENTATIONS
from .losses import CrossEntropy, FeatureMSE, Forward
from .recipes import AMP_RECOVERY, OPTIMIZERS, TEXT_RECIPE, TrainConfig, lr_factor

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_EVERY = 600.0  # seconds: within a long epoch too, a killed run loses at most this much
Loss = Callable[[Any, dict[str, Any]], Tensor]


def train(
    model: nn.Module,
    train_loader: Iterable[Batch],
    config: TrainConfig,
    *,
    loss: Loss,
    forward: Forward | None = None,
    val_loader: Iterable[Batch] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: float | None = CHECKPOINT_EVERY,
    progress: bool = True,
    desc: str = "training",
) -> nn.Module:
    """Train `model` in place with `loss(forward(model, inputs), batch)`; returns it in eval mode.

    Args:
        model: a supported HF model (or a PEFT wrapper of one); or any module that returns a predictor output
            (a fused `HydraEnsemble`, a `distill.MultiHeadMLP`).
        train_loader: batches of model inputs, plus whatever `loss` reads (e.g. `labels`, `teacher_outputs`).
        config: optimiser, schedule, epochs, freezing (HF models only), early stopping (`TrainConfig`).
        loss: called as `loss(output, batch)` -> scalar tensor; see `training.losses`.
        forward: `forward(model, inputs)` -> output; default: an HF model's logits (or pooled output), another
            module's member outputs (B, M, C) (`outputs.member_outputs_of`).
        val_loader: labelled validation batches (classes; a regressor's float targets, monitored by NLL only):
            the epoch with the best `config.monitor` ("acc": highest accuracy, "nll": lowest NLL; an improvement
            must exceed `min_delta`, so a tie keeps the earlier epoch; "acc_nll": highest accuracy, an epoch as
            accurate within `min_delta` improving when its NLL is lower by more than `min_delta`) is kept, and
            training stops after `patience` epochs without one.
        checkpoint_dir: where a checkpoint is written (atomically) after every epoch (and within one, see
            `checkpoint_every`); a run started again with it resumes and ends with the same weights as an
            uninterrupted one. A checkpoint written under another config, loss, starting model or data (or split of
            it into training and validation), set of trainable parameters or number of processes is refused.
        checkpoint_every: seconds between checkpoints within an epoch too (default 10 minutes; None: at epoch
            ends only), so that a killed run loses at most that much of a long epoch; it resumes at the step it
            reached, with the batch order and random streams it had there. One process only: under torchrun
            each rank draws its own dropout, and the checkpoints come at epoch ends. Each checkpoint writes the
            model, its optimiser state and the best epoch's weights (about 4x the model's size).

    Batches are reshuffled every epoch from `config.seed`, and dropout is seeded per epoch; with `config.augment`,
    every training batch is augmented (`training.augment`) with draws seeded per epoch too. `model.training_history`
    lists every epoch; `model.kept_epoch` is the epoch whose weights were returned. What `config` freezes
    (`freeze_embeddings`, `train_last`) is frozen for this call only: trainable again when it returns.
    """
    if checkpoint_dir is not None and Path(checkpoint_dir).exists() and not Path(checkpoint_dir).is_dir():
        raise ValueError(f"checkpoint_dir {str(checkpoint_dir)!r} is a file: give a folder (it is created).")
    adapter, is_hf = _family(model)
    if forward is None:
        forward = (lambda m, x: adapter.output(m, x)) if is_hf else (lambda m, x: member_outputs_of(m(**x)))
    batches = materialize(train_loader, "training loader")
    val_batches = materialize(val_loader, "validation loader") if val_loader is not None else None
    _check_ranks_share(batches, val_batches)
    if is_distributed() and getattr(loss, "batch_coupled", False):
        raise ValueError(
            f"the {getattr(loss, 'name', type(loss).__name__)} loss reads each example with the rest of its batch "
            "(contrastive targets, MIMO's mixed inputs): sharded across processes, each would see a part of it. "
            "Train it on one process."
        )
    if val_batches is not None and any(batch.get("labels") is None for batch in val_batches):
        raise ValueError(  # found now, not after the first epoch's training
            "the validation loader has batches without 'labels': validation scores the model against them; give "
            "labelled validation data, or no val_loader."
        )
    if val_batches is not None and config.monitor != "nll" and getattr(model, "regression", False):
        raise ValueError(f"a regressor has no accuracy to monitor (monitor={config.monitor!r}): use monitor='nll'.")
    was_trainable, was_training = [p for p in model.parameters() if p.requires_grad], model.training
    try:
        trainable = _select_trainable(model, _locator(model, adapter if is_hf else None), config)
        augment = AUGMENTATIONS[config.augment] if config.augment is not None else None
        optimizer = OPTIMIZERS[config.optimizer](trainable, config, _stacked_vectors(model))
        total = config.epochs * len(batches)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(config, total))
        identity = {"config": config.key(), "loss": getattr(loss, "name", type(loss).__name__)}
        path = Path(checkpoint_dir) / CHECKPOINT if checkpoint_dir is not None else None
        if path is not None:  # what the run starts from, so that another model's or data's checkpoint is refused
            identity |= {"start": weights_digest(model), "data": batches_digest([*batches, *(val_batches or [])])}
            # the split between training and validation batches (the digest covers both) and the loss's own settings
            identity |= {"train_batches": len(batches)} | ({"loss_key": loss.key()} if hasattr(loss, "key") else {})
            # what trains (the optimiser's state is per parameter) and on how many processes (dropout's streams)
            identity |= {"trainable": _trainable_names(model), "world": world_size()}
            # how the model itself trains, where its weights do not say (MIMO's input repetition)
            identity |= {"model_key": model.training_key()} if hasattr(model, "training_key") else {}
        state = {"epoch": 0, "history": [], "best": None, "best_epoch": None, "best_score": -math.inf, "stale": 0}
        if path is not None and path.exists():
            state = _resume(path, model, optimizer, schedule, identity)
        device = next(model.parameters()).device
        warn_if_emulated_bf16(config.precision, device.type, "training")
        # unused parameters: CLIP's and SigLIP's image classifiers skip their vision tower's post-norm / pooling head
        runner = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True) if is_distributed() else model
        within = state.pop("within", None)  # where a checkpoint written within an epoch stopped
        every = checkpoint_every if path is not None and not is_distributed() else None
        done = state["epoch"] * len(batches) + (within["step"] if within else 0)
        with tqdm(total=total, initial=done, desc=desc, disable=not progress or not is_main()) as bar:
            for epoch in range(state["epoch"], config.epochs):
                if config.patience is not None and state["stale"] >= config.patience:
                    break
                model.train()
                # dropout masks: one stream per process (one process: the seed it always had)
                torch.manual_seed((config.seed * 1000 + epoch) * world_size() + rank())
                draws = torch.Generator().manual_seed(config.seed * 1000 + epoch)  # batch order, then augmentation
                order = torch.randperm(len(batches), generator=draws)
                losses, start = [], 0
                if within is not None:  # resumed within this epoch: the streams as they were at its step
                    losses, start = within["losses"], within["step"]
                    _set_streams(within["streams"], draws, device)
                    within = None
                last_save = time.monotonic()
                for step, index in enumerate(order.tolist()[start:], start=start):
                    batch = batches[index] if augment is None else augment(batches[index], draws)  # whole batch: as
                    share, batch = _my_rows(batch)  # one process would, under torchrun too
                    batch = to_device(batch, device)
                    inputs, _ = split_batch(adapter, batch)
                    with torch.autocast(device.type, torch.bfloat16, enabled=config.precision == "bf16"):
                        value = loss(forward(runner, inputs), batch)
                    optimizer.zero_grad(set_to_none=True)
                    (value * share).backward()
                    if config.clip is not None:
                        nn.utils.clip_grad_norm_(trainable, config.clip)
                    optimizer.step()
                    schedule.step()
                    losses.append(value.item() * share)  # summed over ranks / world: the whole batch's mean
                    bar.update()
                    bar.set_postfix(epoch=epoch + 1, loss=f"{value.item():.3f}")
                    if every is not None and step + 1 < len(order) and time.monotonic() - last_save >= every:
                        within = {"step": step + 1, "losses": losses, "streams": _streams(draws, device)}
                        _save(path, model, optimizer, schedule, identity, state | {"within": within})
                        within, last_save = None, time.monotonic()
                record = {"epoch": epoch + 1, "loss": sum_over_ranks(sum(losses)) / world_size() / len(losses)}
                if val_batches is not None:
                    record.update(from_main(validate(model, val_batches)))  # every rank stops alike
                    if _remember(record, state, config):
                        state["best"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
                state["history"].append(record)
                state["epoch"] = epoch + 1
                if path is not None and is_main():
                    _save(path, model, optimizer, schedule, identity, state)
                barrier()
        if val_batches is not None and state["best"] is None and state["history"]:
            raise ValueError(
                f"every validated epoch diverged (non-finite outputs in all {len(state['history'])}): no weights "
                "worth keeping; train again with a lower learning rate (lr, --lr)."
            )
        if state["best"] is not None:
            model.load_state_dict(state["best"])
        model.training_history = state["history"]
        model.kept_epoch = state.get("best_epoch") or state["epoch"]
        return model.eval()
    except BaseException:  # a failed or killed run leaves the model in the mode it was given in
        model.train(was_training)
        raise
    finally:  # what the config froze is frozen for this call only
        for param in was_trainable:
            param.requires_grad_(True)


def _score(record: dict, config: TrainConfig) -> float:
    """The monitored validation score, higher = better."""
    return -record["val_nll"] if config.monitor == "nll" else record["val_acc"]


def _remember(record: dict, state: dict, config: TrainConfig) -> bool:
    """Update the best-epoch bookkeeping with one epoch's validation `record`; whether it is the new best."""
    if not _improves(record, state, config):
        state["stale"] += 1
        return False
    # max: an "acc_nll" tie within min_delta below the best must not lower the bar for the epochs after it
    state["best_score"] = max(_score(record, config), state["best_score"])
    state["stale"], state["best_epoch"], state["best_nll"] = 0, record["epoch"], record["val_nll"]
    return True


def _improves(record: dict, state: dict, config: TrainConfig) -> bool:
    """Whether this epoch beats the best so far by more than `min_delta` on `config.monitor`; under "acc_nll" an
    epoch as accurate as the best (within min_delta) with an NLL lower by more than min_delta also does."""
    score, best = _score(record, config), state["best_score"]
    if score > best + config.min_delta:
        return True
    tied = config.monitor == "acc_nll" and score >= best - config.min_delta
    return tied and record["val_nll"] < state.get("best_nll", math.inf) - config.min_delta


def finetune(
    model: nn.Module,
    train_loader: Iterable[Batch],
    config: TrainConfig = TEXT_RECIPE,
    *,
    val_loader: Iterable[Batch] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: float | None = CHECKPOINT_EVERY,
    progress: bool = True,
) -> nn.Module:
    """Fine-tune a classifier in place with cross-entropy on its logits (`train` with the recipe's label
    smoothing); returns it in eval mode, with its best-validation weights if `val_loader` is given."""
    if not get_adapter(_unwrapped(model)).is_classifier(_unwrapped(model)):
        raise ValueError(
            f"{type(_unwrapped(model)).__name__} has no classifier to fine-tune: load it with "
            "AutoModelForSequenceClassification / AutoModelForImageClassification (num_labels=...), or run "
            "`hydra-ens finetune`, which adds one."
        )
    return _cross_entropy(model, train_loader, config, val_loader, checkpoint_dir, checkpoint_every, progress)


def finetune_fused(
    ensemble: nn.Module,
    train_loader: Iterable[Batch],
    config: TrainConfig = TEXT_RECIPE,
    *,
    val_loader: Iterable[Batch] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: float | None = CHECKPOINT_EVERY,
    progress: bool = True,
) -> nn.Module:
    """Fine-tune a fused ensemble (`HydraEnsemble`) as one module, in place (paper 000, Fig. 1: prune, fuse, then
    fine-tune). The loss is each member's cross-entropy on its own logits of member_logits (B, M, C), summed over
    members (`CrossEntropy`): a tensor the members share (the merged MLP, norms, embeddings) gets the sum of all
    members' gradients, a member's own heads and classifier only its own. Fuse members that were pruned and not
    fine-tuned: they share those tensors exactly, so the ensemble is exactly its members before training and
    stays so (`HydraEnsemble.unfuse` returns them as HF models). With `val_loader`, the epoch kept is chosen on
    the ensemble's validation NLL or accuracy (`config.monitor`). The fused ensemble has no dropout (its layers,
    embeddings and classifier heads alike): fine-tuning it is fine-tuning the members without dropout.

    Returns the ensemble in eval mode (`training_history`, `kept_epoch` as `train`)."""
    if not getattr(ensemble, "is_classifier", False) or not hasattr(ensemble, "num_members"):
        raise ValueError(
            f"finetune_fused trains a fused classifier ensemble (HydraEnsemble.fuse of classifiers); got a "
            f"{type(ensemble).__name__}: fine-tune one HF classifier with training.finetune."
        )
    desc = "fine-tuning the fused ensemble"
    return _cross_entropy(ensemble, train_loader, config, val_loader, checkpoint_dir, checkpoint_every, progress, desc)


def _cross_entropy(
    model: nn.Module,
    train_loader: Iterable[Batch],
    config: TrainConfig,
    val_loader: Iterable[Batch] | None,
    checkpoint_dir: str | os.PathLike | None,
    checkpoint_every: float | None,
    progress: bool,
    desc: str = "fine-tuning",
) -> nn.Module:
    """`train` with cross-entropy on the logits (summed over members for member logits, `CrossEntropy`) and the
    recipe's label smoothing: what `finetune` and `finetune_fused` share once each has checked its model."""
    return train(
        model,
        _labelled(train_loader),
        config,
        loss=CrossEntropy(config.label_smoothing),
        val_loader=val_loader,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        progress=progress,
        desc=desc,
    )


def _labelled(loader: Iterable[Batch]) -> list[Batch]:
    batches = materialize(loader, "training loader")
    if any(batch.get("labels") is None for batch in batches):
        raise ValueError("training batches need 'labels': give the loader a label column (the CLI's --label-column).")
    return batches


def last_hidden_states(model: nn.Module, inputs: dict[str, Any]) -> Tensor:
    """A forward for feature distillation: the encoder's last-layer token features (B, T, d)."""
    adapter = get_adapter(_unwrapped(model))
    return adapter.backbone(_unwrapped(model))(**inputs).last_hidden_state


def recover(
    student: nn.Module,
    teacher: nn.Module,
    train_loader: Iterable[Batch],
    config: TrainConfig = AMP_RECOVERY,
    *,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: float | None = CHECKPOINT_EVERY,
    progress: bool = True,
) -> nn.Module:
    """Recovery of a pruned model by distillation from the unpruned one (paper 002, §3.5, Eq. 8): the loop with
    `FeatureMSE` on the last layer's features; labels are not needed. One process only: the features are read
    from the student's encoder directly, which DistributedDataParallel would not synchronise."""
    if is_distributed():
        raise ValueError(
            "recovery (paper 002, Eq. 8) runs on one process: call `recover` without torchrun; the library calls "
            "after it (circuit extraction, finetune) can run under torchrun again (the CLI runs on one process)."
        )
    return train(
        student,
        train_loader,
        config,
        loss=FeatureMSE(teacher, last_hidden_states),
        forward=last_hidden_states,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        progress=progress,
        desc="recovery",
    )


def validate(model: nn.Module, batches: list[Batch]) -> dict[str, float]:
    """Validation accuracy and NLL of a classifier (of its ensemble probability, for M members); the NLL of a
    regressor's Gaussian mixture (a model with `regression = True`). A model whose outputs are not finite (a
    diverged epoch) scores NaN, which never counts as an improvement: patience ends the run, the best epoch kept."""
    outputs, labels = collect_member_logits(model, batches), labels_of(batches)
    regressor = getattr(model, "regression", False)
    if not torch.isfinite(outputs).all():
        return {"val_nll": math.nan} if regressor else {"val_acc": math.nan, "val_nll": math.nan}
    if regressor:
        return {"val_nll": gaussian_mixture_nll(outputs, labels)}
    probs = ensemble_probs(outputs.double())
    return {"val_acc": accuracy(probs, labels), "val_nll": nll(probs, labels)}


def _family(model: nn.Module) -> tuple[Adapter | None, bool]:
    """(the model's family adapter, whether it is an HF model): an HF model's adapter (unsupported classes are
    refused), a fused ensemble's own adapter (it reads the same inputs), or None for a plain module."""
    base = _unwrapped(model)
    if isinstance(base, transformers.PreTrainedModel):
        return get_adapter(base), True
    return getattr(base, "adapter", None), False


def _locator(model: nn.Module, adapter: Adapter | None) -> tuple[Callable[[str], tuple[str, int | None]], int] | None:
    """(where a parameter of `model` sits, by its name: ("embeddings", None), ("layer", index) or ("head", None);
    the number of layers) for an HF model (its adapter's `locate`) or a fused ensemble (its own); None for a plain
    module, whose parts have no such names."""
    base = _unwrapped(model)
    if adapter is not None:
        return partial(adapter.locate, base), adapter.num_layers(base)
    if hasattr(base, "locate") and hasattr(base, "num_layers"):
        return base.locate, base.num_layers
    return None


def _select_trainable(
    model: nn.Module, locator: tuple[Callable[[str], tuple[str, int | None]], int] | None, config: TrainConfig
) -> list[nn.Parameter]:
    """Freeze what the config keeps fixed; return the parameters left to train (those trainable already).
    locator=None (a plain module): nothing is frozen by name."""
    if locator is None:
        if config.freeze_embeddings or config.train_last is not None:
            raise ValueError(
                f"freeze_embeddings and train_last name parts of an HF model or a fused ensemble; a "
                f"{type(model).__name__} has none: set requires_grad on its parameters instead."
            )
    else:
        locate, num_layers = locator
        for name, param in _unwrapped(model).named_parameters():
            where = locate(name)
            if config.freeze_embeddings and where[0] == "embeddings":
                param.requires_grad_(False)
            if config.train_last is not None and (
                where[0] == "embeddings" or (where[0] == "layer" and where[1] < num_layers - config.train_last)
            ):
                param.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("nothing to train: every parameter is frozen.")
    return trainable


def _stacked_vectors(model: nn.Module) -> set[int]:
    """Ids of the parameters `model` names in `no_weight_decay()` (one bias / norm / scale vector per member,
    stacked: the optimiser treats them as the 1-D parameters they are per member); empty for a module without it."""
    base = _unwrapped(model)
    names = set(base.no_weight_decay()) if hasattr(base, "no_weight_decay") else set()
    return {id(p) for name, p in base.named_parameters() if name in names}


def _trainable_names(model: nn.Module) -> str:
    """A digest of the names of the parameters that train, in the optimiser's order."""
    names = "\n".join(name for name, param in model.named_parameters() if param.requires_grad)
    return hashlib.sha256(names.encode()).hexdigest()[:16]


def _streams(draws: torch.Generator, device: torch.device) -> dict[str, Any]:
    """The random streams a step draws from: the batch order's and augmentation's generator, and dropout's
    (the CPU's, and the accelerator's when the model is on one)."""
    streams = {"draws": draws.get_state(), "cpu": torch.get_rng_state(), "device": device.type}
    if device.type == "cuda":
        streams["cuda"] = torch.cuda.get_rng_state(device)
    return streams


def _set_streams(streams: dict[str, Any], draws: torch.Generator, device: torch.device) -> None:
    draws.set_state(streams["draws"])
    torch.set_rng_state(streams["cpu"])
    if streams.get("device", device.type) != device.type:
        warnings.warn(
            f"the checkpoint was written within an epoch on {streams['device']} and resumes on {device.type}: the "
            "dropout masks of that epoch's remaining steps differ from an uninterrupted run's.",
            RuntimeWarning,
            stacklevel=3,
        )
    elif "cuda" in streams:
        torch.cuda.set_rng_state(streams["cuda"], device)


def _save(path: Path, model, optimizer, schedule, identity: dict, state: dict) -> None:
    payload = {
        **identity,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "schedule": schedule.state_dict(),
        "state": state,
    }
    torch_save_atomic(payload, path)


def _resume(path: Path, model, optimizer, schedule, identity: dict) -> dict:
    # on the CPU: the random streams of a checkpoint within an epoch must stay CPU tensors (torch.set_rng_state);
    # load_state_dict copies weights and optimiser state to the model's device
    payload = torch.load(path, map_location="cpu", weights_only=False)
    if payload["config"] != identity["config"] or payload.get("loss") != identity["loss"]:
        fields = sorted(set(payload["config"]) | set(identity["config"]))
        changed = [k for k in fields if payload["config"].get(k) != identity["config"].get(k)]
        if payload.get("loss") != identity["loss"]:
            changed.append("loss")
        raise ValueError(
            f"the checkpoint at {str(path)!r} was written with a different config ({changed}); "
            "delete it or pass another checkpoint_dir."
        )
    for key, what in (
        ("start", "starting model"),
        ("data", "training or validation data"),
        ("train_batches", "split of the data into training and validation batches"),
        ("loss_key", "loss setting (label smoothing, teacher)"),
        ("trainable", "set of trainable parameters (what is frozen)"),
        ("world", "number of processes"),
        ("model_key", "model training setting (MIMO's rho or batch repetition)"),
    ):
        if key in payload and payload[key] != identity.get(key):  # a checkpoint written before a key: trusted
            raise ValueError(
                f"the checkpoint at {str(path)!r} was written for another {what} (recorded {payload[key]!r}, this "
                f"run's {identity.get(key)!r}): resuming would continue another run. Delete it or pass another "
                "checkpoint_dir."
            )
    misfits = _misfits(model.state_dict(), payload["model"])
    if misfits:  # checked before loading: a refused checkpoint leaves the model as it was (torch would load part)
        detail = "; ".join(misfits[:3])
        fused = any(isinstance(module, HydraEnsemble) for module in model.modules())
        why = (
            "A fused ensemble lays out its attention by device (ragged on a CPU, padded on a GPU): resume on the "
            "kind of device the run started on (the CLI: the same --device), or lay the ensemble out as then "
            "(`ensemble.set_layout('ragged' | 'padded')`); otherwise delete the checkpoint."
            if fused
            else "It was written for another model: delete it or pass another checkpoint_dir."
        )
        raise ValueError(f"the checkpoint at {str(path)!r} does not fit this model ({detail}). {why}")
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    schedule.load_state_dict(payload["schedule"])
    return payload["state"]


def _misfits(current: dict, saved: dict) -> list[str]:
    """How a saved state dict fails to fit the model's: missing or unexpected keys, shapes that differ."""
    said = [f"missing {k}" for k in current if k not in saved] + [f"unexpected {k}" for k in saved if k not in current]
    shapes = [
        f"size mismatch for {k}: {tuple(saved[k].shape)} saved, {tuple(v.shape)} here"
        for k, v in current.items()
        if k in saved and isinstance(v, Tensor) and tuple(saved[k].shape) != tuple(v.shape)
    ]
    return said + shapes


def _unwrapped(model: nn.Module) -> nn.Module:
    """The HF model inside a PEFT wrapper (LoRA), or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _check_ranks_share(batches: list[Batch], val_batches: list[Batch] | None) -> None:
    """Under torchrun, every rank passes the same batches and takes its rows of each (`_my_rows`): a
    DistributedSampler's shards would train each step on a part of the batch without a word, or wait forever where
    their counts differ. Refused on every rank alike before training, as is a batch too small to share."""
    if not is_distributed():
        return
    check_same_on_every_rank(
        {"training data": batches_digest(batches), "validation data": batches_digest(val_batches or [])},
        "every rank must pass the same training and validation batches (no DistributedSampler: the loop gives each "
        "rank its share of every batch).",
    )
    smallest = min(examples_in(batch) for batch in batches)
    if smallest < world_size():
        raise ValueError(
            f"a batch of {smallest} rows cannot be shared among {world_size()} processes: use batches of at least "
            f"{world_size()} rows."
        )


def _my_rows(batch: Batch) -> tuple[float, Batch]:
    """This rank's rows of a batch (every world_size-th example) and the weight of its mean loss: DDP averages
    the ranks' gradients equally, so a rank holding n of N rows weighs n * world / N (1 when they split evenly),
    and the sum is the gradient of the whole batch's mean loss (every rank holds at least one row:
    `_check_ranks_share`). One process: (1.0, the batch)."""
    if not is_distributed():
        return 1.0, batch
    rows = slice(rank(), None, world_size())
    total = examples_in(batch)
    mine = len(range(total)[rows])
    return mine * world_size() / total, {k: v[rows] if per_example(v) else v for k, v in batch.items()}
