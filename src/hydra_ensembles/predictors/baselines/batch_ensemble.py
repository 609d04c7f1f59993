"""BatchEnsemble (Wen et al., 2020) for Hugging Face transformers: M members share every weight matrix W and each
owns a rank-1 fast weight, W_m = W ∘ (s_m r_m^T); all members run in one forward pass over the batch repeated M
times.

Formula (one linear layer, member m): y_m = ((x ∘ r_m) W^T) ∘ s_m + b_m  =  x (W ∘ (s_m r_m^T))^T + b_m.
Shapes: M members, B inputs, d_in / d_out a linear's sizes, C classes. Inside the model the rows are member-major,
(M·B, …): rows m·B … m·B + B - 1 are member m's copy of the batch; the output is member logits (B, M, C).

Paper 000 (§C.1.4) applies BatchEnsemble to a trained checkpoint and then fine-tunes it on the target task:
`batch_ensemble(model, members=M)` wraps every linear of each layer's attention (q, k, v, o) and MLP (in, out) and
of the classifier head; `training.finetune_fused` fine-tunes it (each member's cross-entropy on its own logits,
summed over members). The paper gives no fast-weight initialisation, learning rate or weight decay, so the fast
weights train with the task's recipe as it is: the same learning rate as W and, like the biases of the model they
wrap, no weight decay under AdamW (`no_weight_decay`: r, s and the members' biases are one vector per member;
SGD decays every parameter, so its recipes set weight_decay=0). They start as
Wen et al. describe: N(1, std) (`init="normal"`, std 0.5 as in torch-uncertainty's BatchLinear), random signs
(`init="sign"`), or ones (`init="ones"`: every member is the checkpoint). Each member's bias starts as the
checkpoint's, so members differ only by their fast weights.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import safetensors.torch
import torch
import torch.nn.functional as F
import transformers
from torch import Tensor, nn

from ...adapters import get_adapter
from ...io import PREDICTOR_FILE, read_safetensors, save_dir_atomic, write_json_atomic
from ...outputs import PredictorOutput
from ...pruning import load_model, save_model
from ..load import register_predictor, saved_record
from ..wrapper import Wrapper

FAST_WEIGHTS = "fast_weights.safetensors"
FastWeightInit = Callable[[tuple[int, ...], torch.Generator, float], Tensor]


def _ones(shape: tuple[int, ...], generator: torch.Generator, std: float) -> Tensor:
    return torch.ones(shape)


def _normal(shape: tuple[int, ...], generator: torch.Generator, std: float) -> Tensor:
    return 1 + std * torch.randn(shape, generator=generator)


def _sign(shape: tuple[int, ...], generator: torch.Generator, std: float) -> Tensor:
    return torch.randint(0, 2, shape, generator=generator) * 2.0 - 1


# how r and s start: (shape, generator, std) -> tensor. "normal" is N(1, std) (Wen et al.'s reference code and
# torch-uncertainty use std 0.5), "sign" is +-1 with probability 1/2 each, "ones" makes every member the checkpoint
FAST_WEIGHT_INITS: dict[str, FastWeightInit] = {"ones": _ones, "normal": _normal, "sign": _sign}


class BatchEnsembleLinear(nn.Module):
    """One linear layer of M members: the shared weight W (d_out, d_in) and each member's fast weights
    r (M, d_in), s (M, d_out) and bias (M, d_out) (None when the wrapped linear had none).

    Inside `BatchEnsemble.forward` (`rows_are_members`): input (M·B, …, d_in), member-major; output (M·B, …, d_out).
    Run alone (the HF model inside a BatchEnsemble, its `base`, called directly): member 0, as a deep ensemble's
    `base` is its first member. Built with r = s = 1 and every member's bias equal to the wrapped linear's, so that
    each member starts as that linear."""

    def __init__(self, linear: nn.Linear, members: int):
        super().__init__()
        self.members = members
        self.weight = linear.weight  # shared by every member, (d_out, d_in)
        like = dict(device=linear.weight.device, dtype=linear.weight.dtype)
        self.r = nn.Parameter(torch.ones(members, linear.in_features, **like))
        self.s = nn.Parameter(torch.ones(members, linear.out_features, **like))
        bias = None if linear.bias is None else linear.bias.detach().expand(members, -1).clone()
        self.bias = None if bias is None else nn.Parameter(bias)
        self.rows_are_members = False

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        if not self.rows_are_members:  # run alone: member 0
            y = F.linear(x * self.r[0], self.weight) * self.s[0]
            return y if self.bias is None else y + self.bias[0]
        if x.shape[0] % self.members:
            raise ValueError(
                f"a BatchEnsemble layer of {self.members} members reads the batch repeated {self.members} times "
                f"(member-major rows), got {x.shape[0]} rows."
            )
        grouped = x.reshape(self.members, -1, self.in_features)  # (M, B·…, d_in): member m's rows
        y = F.linear(grouped * self.r[:, None], self.weight) * self.s[:, None]  # (M, B·…, d_out)
        if self.bias is not None:
            y = y + self.bias[:, None]
        return y.reshape(*x.shape[:-1], self.out_features)  # (M·B, …, d_out)

    def member_linear(self, member: int) -> nn.Linear:
        """Member `member` as a plain linear layer: weight W ∘ (s_m r_m^T), bias b_m (copies)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        weight = self.weight * torch.outer(self.s[member], self.r[member])  # (d_out, d_in)
        linear.weight = nn.Parameter(weight.detach().clone())
        if self.bias is not None:
            linear.bias = nn.Parameter(self.bias[member].detach().clone())
        return linear

    def shared_linear(self) -> nn.Linear:
        """A plain linear layer holding the shared W itself (not a copy) and member 0's bias: what the saved HF
        model holds in this layer's place (the fast weights are saved apart)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = self.weight
        if self.bias is not None:
            linear.bias = nn.Parameter(self.bias[0].detach().clone())
        return linear

    def extra_repr(self) -> str:
        return f"members={self.members}, in_features={self.in_features}, out_features={self.out_features}"


def ensemble_linears(model: nn.Module) -> list[str]:
    """The dotted paths, in `model`, of the linears BatchEnsemble wraps: each layer's q, k, v, o, MLP in and out
    (the adapter's `LayerNames`) and every linear after the layers (pooler, classifier head), but for those an
    `nn.MultiheadAttention` reads as tensors (the out_proj of SigLIP's attention-pooling head): they stay shared."""
    adapter, names = get_adapter(model), get_adapter(model).layer_names
    layers = adapter.full_path(model, adapter.layers_path)
    # once each: with a fused qkv projection, query, key and value name one linear
    per_layer = tuple(dict.fromkeys((names.query, names.key, names.value, names.output, names.mlp_in, names.mlp_out)))
    paths = [f"{layers}.{index}.{name}" for index in range(adapter.num_layers(model)) for name in per_layer]
    read_as_tensors = tuple(f"{n}." for n, m in model.named_modules() if isinstance(m, nn.MultiheadAttention))
    head = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and adapter.locate(model, f"{name}.weight")[0] == "head"
        and not name.startswith(read_as_tensors)
    ]
    return paths + head


@register_predictor
class BatchEnsemble(Wrapper):
    """M members sharing one HF classifier's weights, each with its own rank-1 fast weights in every linear layer
    it wraps (`linears`, dotted paths in `model`); `model(**inputs).member_logits` is (B, M, C).

    Built with every fast weight 1: each member equals `model` until `batch_ensemble` draws them or training moves
    them. Wraps `model` in place; `batch_ensemble` works on a copy."""

    kind = "batch_ensemble"
    title = "BatchEnsemble (Wen et al., 2020): {members} members of one {model}, rank-1 fast weights around its own"
    is_classifier = True

    def __init__(self, model: nn.Module, members: int, linears: Sequence[str] | None = None):
        super().__init__()
        if members < 2:
            raise ValueError(f"a BatchEnsemble needs members >= 2 (an ensemble of one is the model), got {members}.")
        if not isinstance(model, transformers.PreTrainedModel):
            raise ValueError(f"BatchEnsemble wraps a Hugging Face classifier, got a {type(model).__name__}.")
        adapter = get_adapter(model)  # an unsupported class raises UnsupportedModelError, naming the supported ones
        if not adapter.is_classifier(model):
            raise ValueError(
                f"BatchEnsemble needs a classifier, got {type(model).__name__} (an encoder without one): load it "
                "with AutoModelForSequenceClassification / AutoModelForImageClassification (num_labels=...)."
            )
        _check_no_shared_position_projections(model.config)
        self.model, self.adapter, self.num_members = model, adapter, members
        self.linears = list(ensemble_linears(model) if linears is None else linears)
        for path in self.linears:
            model.set_submodule(path, BatchEnsembleLinear(model.get_submodule(path), members))

    @property
    def base(self) -> nn.Module:
        """The HF model whose config names the classes (its linears are the members' `BatchEnsembleLinear`s)."""
        return self.model

    @property
    def num_layers(self) -> int:
        return self.adapter.num_layers(self.model)

    def locate(self, parameter: str) -> tuple[str, int | None]:
        """Where a parameter (by its name here) sits, as `Adapter.locate` says it of the HF model: so that training
        freezes the embeddings or trains the last layers (`TrainConfig.freeze_embeddings`, `train_last`)."""
        return self.adapter.locate(self.model, parameter.removeprefix("model."))

    def no_weight_decay(self) -> set[str]:
        """The fast weights r, s and the members' biases: one vector per member, undecayed by AdamW as the wrapped
        model's biases are."""
        return {
            f"model.{path}.{name}"
            for path, layer in self.layers()
            for name, _ in layer.named_parameters()
            if name != "weight"
        }

    def layers(self) -> Iterator[tuple[str, BatchEnsembleLinear]]:
        """(path, layer) of every wrapped linear."""
        return ((path, self.model.get_submodule(path)) for path in self.linears)

    def forward(self, **inputs) -> PredictorOutput:
        inputs = {k: v for k, v in inputs.items() if k != "labels"}
        members = self.num_members
        rows = max((v.shape[0] for v in inputs.values() if isinstance(v, Tensor) and v.dim() > 0), default=0)
        repeated = {k: _tiled(v, members, rows) for k, v in inputs.items()}  # (M·B, …), member-major
        with self._rows_are_members():
            logits = self.adapter.output(self.model, repeated)  # (M·B, C)
        return PredictorOutput(member_logits=logits.unflatten(0, (members, -1)).transpose(0, 1))  # (B, M, C)

    def member(self, member: int) -> nn.Module:
        """Member `member` as a plain HF model (a copy): every wrapped linear W ∘ (s_m r_m^T), bias b_m."""
        with self._plain_linears():
            model = copy.deepcopy(self.model)
        for path, layer in self.layers():
            model.set_submodule(path, layer.member_linear(member))
        return model.eval()

    @contextmanager
    def _rows_are_members(self) -> Iterator[None]:
        """The wrapped linears read member-major rows (M·B, …) in the block, and run as member 0 after it."""
        layers = [layer for _, layer in self.layers()]
        for layer in layers:
            layer.rows_are_members = True
        try:
            yield
        finally:
            for layer in layers:
                layer.rows_are_members = False

    # ---- saving ----

    @contextmanager
    def _plain_linears(self) -> Iterator[nn.Module]:
        """The HF model with plain linears (the shared W, member 0's bias) in the wrapped linears' places, for
        the block; the wrappers are put back afterwards."""
        wrapped = dict(self.layers())
        for path, layer in wrapped.items():
            self.model.set_submodule(path, layer.shared_linear())
        try:
            yield self.model
        finally:
            for path, layer in wrapped.items():
                self.model.set_submodule(path, layer)

    def fast_weights(self) -> dict[str, Tensor]:
        """{"<path>.r" (M, d_in), "<path>.s" (M, d_out), "<path>.bias" (M, d_out)} of every wrapped linear."""
        return {
            f"{path}.{name}": tensor.detach().contiguous()
            for path, layer in self.layers()
            for name, tensor in layer.named_parameters(recurse=False)
            if name != "weight"
        }

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """model/ (the HF model with the shared weights), fast_weights.safetensors and predictor.json (kind,
        members, wrapped linears), atomically; read back by `load_predictor`."""

        def write(tmp: Path) -> None:
            with self._plain_linears() as model:
                save_model(model, tmp / "model")
            safetensors.torch.save_file(self.fast_weights(), tmp / FAST_WEIGHTS, metadata={"format": "pt"})
            record = {"kind": self.kind, "members": self.num_members, "linears": self.linears}
            write_json_atomic(tmp / PREDICTOR_FILE, record)

        return save_dir_atomic(path, write)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> BatchEnsemble:
        path = Path(path)
        record = saved_record(path, cls)
        ensemble = cls(load_model(path / "model"), record["members"], record["linears"])
        fast = read_safetensors(path / FAST_WEIGHTS)
        if set(fast) != set(ensemble.fast_weights()):
            raise ValueError(
                f"{str(path / FAST_WEIGHTS)!r} does not hold the fast weights of the linears {PREDICTOR_FILE} names: "
                f"differing keys {sorted(set(fast) ^ set(ensemble.fast_weights()))[:4]}; save it again."
            )
        ensemble.model.load_state_dict(fast, strict=False)
        return ensemble.eval()

    @classmethod
    def describe(cls, path: Path) -> str:
        members = json.loads((path / PREDICTOR_FILE).read_text())["members"]
        return f"a BatchEnsemble of {members} members"


def batch_ensemble(
    model: nn.Module, members: int = 3, init: str = "normal", *, std: float = 0.5, seed: int = 0
) -> BatchEnsemble:
    """A BatchEnsemble of `members` built on a copy of the HF classifier `model` (left unchanged), its fast
    weights r and s drawn by `init` (an entry of `FAST_WEIGHT_INITS`; `std` for "normal") from `seed`; each
    member's bias starts as the checkpoint's. Fine-tune it with `training.finetune_fused`."""
    if init not in FAST_WEIGHT_INITS:
        raise ValueError(f"init must be one of {sorted(FAST_WEIGHT_INITS)}, got {init!r}.")
    ensemble = BatchEnsemble(copy.deepcopy(model), members)
    draw, generator = FAST_WEIGHT_INITS[init], torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in ensemble.layers():
            layer.r.copy_(draw(tuple(layer.r.shape), generator, std))
            layer.s.copy_(draw(tuple(layer.s.shape), generator, std))
    return ensemble.train(model.training)


def _check_no_shared_position_projections(config) -> None:
    """DeBERTa-v3 (share_att_key) runs each layer's query and key projections on the relative-position table too,
    one (1, 2k, d) copy for every member: a BatchEnsemble linear reads M·B rows and has no member for it."""
    shares = getattr(config, "relative_attention", False) and getattr(config, "share_att_key", False)
    if shares and getattr(config, "pos_att_type", None):
        raise ValueError(
            f"BatchEnsemble does not support a {config.model_type} with share_att_key=True (DeBERTa-v3): its query "
            "and key projections also read the relative-position table, one copy shared by all members, which rank-1 "
            "fast weights per member cannot serve. Use a DeBERTa-v2 configuration with its own position projections "
            "(share_att_key=False), or another ensemble (Hydra, Packed, a deep ensemble)."
        )


def _tiled(value: object, members: int, rows: int) -> object:
    """A per-example tensor (B, …) repeated as (M·B, …), member-major; anything else (a flag, a (1, T) table of
    positions that broadcasts over the batch) as it is."""
    if not isinstance(value, Tensor) or value.dim() == 0 or value.shape[0] != rows:
        return value
    return value.repeat(members, *[1] * (value.dim() - 1))
