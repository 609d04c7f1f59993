"""Packed-Ensembles (Laurent et al., 2023) of transformers: M members of width alpha*d/M, trained from scratch and
run as one module.

With gamma = 1 a Packed-Ensemble of transformers is M independent narrower transformers whose linear layers are
grouped (block-diagonal) projections run in one pass. That is what the fused engine runs, so it is built as one:
M freshly initialised HF models of the narrow config, fused with `HydraEnsemble.fuse(mlp="stack")` (each member
keeps its own attention, MLP, norms, embeddings and classifier) and untied (`HydraEnsemble.untie`: no tensor is
stored once for all members, so training cannot couple them). No second grouped kernel.

Narrow config of a model with H heads of size dh and MLP width F (hidden d = H*dh): each member has
h = round(alpha*H/M) heads of the same size dh, hidden size h*dh, and MLP width round(alpha*F/M), rounding half up
(ViT hidden 128 = 8 x 16, MLP 256, M = 3, alpha = 2: 5 heads, hidden 80, MLP 171). Depth and everything else are
the model's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

import transformers
from torch import nn

from ...data.loaders import Batch
from ...fusion import HydraEnsemble
from ...io import PREDICTOR_FILE, save_dir_atomic, write_json_atomic
from ...outputs import PredictorOutput
from ...pruning.persist import FINGERPRINT_KEY
from ...seeding import seeded
from ...training import TrainConfig, finetune_fused
from ..load import register_predictor, saved_record
from ..wrapper import Wrapper

FUSED_DIR = "fused"
WIDTH_FIELDS = ("hidden_size", "num_attention_heads", "intermediate_size")


def round_half_up(value: float) -> int:
    return math.floor(value + 0.5)


def packed_config(config: transformers.PretrainedConfig, members: int, alpha: float) -> transformers.PretrainedConfig:
    """Each member's config: round(alpha*H/M) heads of the model's head size, MLP width round(alpha*F/M).

    The width alpha*d/M is the paper's; it is split into whole heads of the model's size, where torch-uncertainty's
    PackedMultiheadAttention keeps H heads of alpha*d/(M*H) each (42.67 for ViT-B at alpha=2, M=3: not a size)."""
    missing = [name for name in WIDTH_FIELDS if not isinstance(getattr(config, name, None), int)]
    if missing:
        raise ValueError(
            f"Packed-Ensembles narrow a config through {list(WIDTH_FIELDS)}; a {type(config).__name__} lacks "
            f"{missing} (supported: ViT- and BERT-style configs)."
        )
    if members < 1 or alpha <= 0:
        raise ValueError(f"Packed-Ensembles need members >= 1 and alpha > 0, got members={members}, alpha={alpha}.")
    # a config's own head_dim (ViT's reads it) travels with the copy: the narrow width must be made of it
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    heads = round_half_up(alpha * config.num_attention_heads / members)
    if heads < 1:
        raise ValueError(
            f"alpha={alpha} with {members} members leaves each member round({alpha} x "
            f"{config.num_attention_heads} / {members}) = 0 heads: raise alpha or lower the members."
        )
    narrow = copy.deepcopy(config)
    narrow.num_attention_heads = heads
    narrow.hidden_size = heads * head_dim
    narrow.intermediate_size = round_half_up(alpha * config.intermediate_size / members)
    return narrow


@register_predictor
class PackedEnsemble(Wrapper):
    """M narrow transformers fused into one module (`fused`, a `HydraEnsemble`); member logits (B, M, C)."""

    kind = "packed_ensemble"
    # the model card's title (`card.py`)
    title = "Packed-Ensembles (Laurent et al., 2023): {members} narrow {model} networks trained from scratch, fused"

    def __init__(self, fused: HydraEnsemble, alpha: float, gamma: int = 1, source_config: dict | None = None):
        super().__init__()
        self.fused, self.alpha, self.gamma = fused, alpha, gamma
        self.source_config = source_config  # the full-width model's config, which the members narrow

    def reference_model(self) -> nn.Module | None:
        """One full-width model of the config the members were narrowed from (randomly initialised: the model
        card reads its size and FLOPs); None for a save made before the config was recorded."""
        if self.source_config is None:
            return None
        model_class = self.fused.model_class
        return model_class(model_class.config_class.from_dict(self.source_config)).eval()

    def card_method_lines(self) -> list[str]:
        """What the model card says of the method, in place of a Hydra Ensemble's head table."""
        config = self.fused.model_config
        return [
            f"- members: {self.num_members} narrow networks (alpha={self.alpha:g}, gamma={self.gamma}: each "
            f"{config.num_attention_heads} heads, hidden size {config.hidden_size}, MLP width "
            f"{config.intermediate_size}), trained from scratch, run in one pass as grouped projections"
        ]

    @property
    def base(self) -> nn.Module:
        """The fused engine: its config names the classes (each member's narrow config)."""
        return self.fused

    @property
    def num_members(self) -> int:
        return self.fused.num_members

    def forward(self, **inputs) -> PredictorOutput:
        return self.fused(**inputs)

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """predictor.json and the fused engine in fused/, atomically."""

        def write(tmp: Path) -> None:
            self.fused.save_pretrained(tmp / FUSED_DIR)
            record = {"kind": self.kind, "members": self.num_members, "alpha": self.alpha, "gamma": self.gamma}
            record["source_config"] = self.source_config
            write_json_atomic(tmp / PREDICTOR_FILE, record)

        return save_dir_atomic(path, write)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> PackedEnsemble:
        path = Path(path)
        record = saved_record(path, cls)
        fused = HydraEnsemble.from_pretrained(path / FUSED_DIR)
        return cls(fused, record["alpha"], record["gamma"], record.get("source_config")).eval()

    @classmethod
    def describe(cls, path: Path) -> str:
        record = json.loads((path / PREDICTOR_FILE).read_text())
        return f"a Packed-Ensemble of {record['members']} members (alpha={record['alpha']:g})"


def packed_ensemble(
    model: nn.Module, members: int = 3, alpha: float = 2.0, gamma: int = 1, seed: int = 0
) -> PackedEnsemble:
    """An untrained Packed-Ensemble shaped after `model` (an HF model: its class and config; its weights are not
    used): `members` models of `packed_config`, each freshly initialised (from `seed`, one after another), fused.
    gamma = 1 only (gamma > 1 would split each member into subgroups, which no transformer row of the paper uses).
    Train it with `train_packed`."""
    if gamma != 1:
        raise ValueError(
            f"only gamma=1 is implemented (no subgroups: §C.1.4 gives E=3 and alpha=2 and no gamma), got gamma={gamma}."
        )
    config = packed_config(model.config, members, alpha)
    with seeded(seed):  # the caller's random state is left as it was
        narrow = [type(model)(copy.deepcopy(config)).to(next(model.parameters()).device) for _ in range(members)]
    # Fusion fuses pruned copies of one checkpoint, checked by a fingerprint of the embeddings; these members are
    # one initialisation of one Packed-Ensemble, recorded as such.
    fingerprint = hashlib.sha256(f"packed:{members}:{alpha}:{seed}".encode()).hexdigest()[:16]
    for member in narrow:
        setattr(member.config, FINGERPRINT_KEY, fingerprint)
    fused = HydraEnsemble.fuse(narrow, mlp="stack").untie()
    return PackedEnsemble(fused, alpha, gamma, model.config.to_dict()).eval()


def train_packed(
    packed: PackedEnsemble,
    train_loader: Iterable[Batch],
    config: TrainConfig,
    *,
    val_loader: Iterable[Batch] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    progress: bool = True,
) -> PackedEnsemble:
    """Train the members from scratch, in place, as one module: the one training loop (`finetune_fused`: each
    member's cross-entropy on its own logits, summed). The fused ensemble has no dropout (layers, embeddings, heads).
    Returns `packed` in eval mode, with the loop's `training_history` and `kept_epoch`."""
    finetune_fused(
        packed.fused, train_loader, config, val_loader=val_loader, checkpoint_dir=checkpoint_dir, progress=progress
    )
    packed.training_history, packed.kept_epoch = packed.fused.training_history, packed.fused.kept_epoch
    return packed.eval()
