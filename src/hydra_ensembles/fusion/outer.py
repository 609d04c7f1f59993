"""Everything of the members outside their layers: embeddings before, final norm / pooler / classifier after.

The HF modules that compute these are reused as they are, through `torch.func.functional_call` on a
structure-only copy of the model (its layers removed, its tensors on the meta device) — the torch.func
model-ensembling recipe. The real tensors live here in two stores: `shared` (one copy) and `member` (stacked
along a leading M axis). A call that involves per-member tensors is `torch.vmap`-ed over members, so the M heads
(and, when members' embeddings differ, the M embeddings) run as batched ops, not a Python loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from ..adapters import Adapter
from ..adapters.base import LayerAttention


class TensorStore(nn.Module):
    """A flat, saveable dict of named tensors (dotted names are stored with '.' -> '/')."""

    def __init__(self, tensors: Mapping[str, Tensor], parameters: set[str]):
        super().__init__()
        for name, tensor in tensors.items():
            key = name.replace(".", "/")
            if name in parameters:
                self.register_parameter(key, nn.Parameter(tensor, requires_grad=tensor.is_floating_point()))
            else:
                self.register_buffer(key, tensor)

    def tensors(self) -> dict[str, Tensor]:
        own = dict(self.named_parameters(recurse=False)) | dict(self.named_buffers(recurse=False))
        return {key.replace("/", "."): tensor for key, tensor in own.items()}

    def parameter_names(self) -> list[str]:
        return [key.replace("/", ".") for key, _ in self.named_parameters(recurse=False)]

    @staticmethod
    def from_state(state: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
        """The tensors a store saved under `prefix` in a state dict, by their dotted names."""
        return {k[len(prefix) :].replace("/", "."): v for k, v in state.items() if k.startswith(prefix)}


class _Apply(nn.Module):
    """`_Apply(model)(fn, *args) == fn(model, *args)`: lets functional_call run any function of the model."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[..., Tensor], *args: Any) -> Tensor:
        return fn(self.model, *args)


class OuterModules(nn.Module):
    """The members' embeddings and heads.

    Args:
        adapter: the family adapter.
        skeleton: the HF model class built without layers, on the meta device (structure only).
        shared: tensors common to all members, by their dotted name in `skeleton`.
        member: tensors that differ per member, each stacked to (M, ...).
        parameters: which of those names are parameters (the rest are buffers).
    """

    def __init__(
        self,
        adapter: Adapter,
        skeleton: nn.Module,
        shared: Mapping[str, Tensor],
        member: Mapping[str, Tensor],
        parameters: set[str],
    ):
        super().__init__()
        self.adapter = adapter
        self.__dict__["_apply_fn"] = _Apply(skeleton)  # outside the module tree: .to() must not touch meta
        self.shared = TensorStore(shared, parameters)
        self.member = TensorStore(member, parameters)
        self.embeddings_per_member = any(name.startswith(adapter.embedding_prefixes(skeleton)) for name in member)

    @property
    def skeleton(self) -> nn.Module:
        return self._apply_fn.model

    def _call(self, member_tensors: Mapping[str, Tensor], fn: Callable[..., Tensor], *args: Any) -> Tensor:
        tensors = {f"model.{k}": v for k, v in (self.shared.tensors() | dict(member_tensors)).items()}
        return functional_call(self._apply_fn, tensors, (fn, *args), strict=True)

    def embed(self, inputs: Mapping[str, Any]) -> Tensor:
        """Hidden states entering layer 0: (1, B, T, d) computed once when the members share their embeddings,
        else (M, B, T, d)."""

        def embed(model: nn.Module, inputs: Mapping[str, Any]) -> Tensor:
            return self.adapter.embed(self.adapter.backbone(model), inputs)

        if not self.embeddings_per_member:
            return self._call(self.member_slice(0), embed, inputs)[None]  # (1, B, T, d)
        return self._each_member(lambda tensors: self._call(tensors, embed, inputs), self.member.tensors())

    def attention_bias(self, seq_len: int) -> Tensor | None:
        """The additive score bias every layer shares (`Adapter.attention_bias`, e.g. MPNet's relative position
        bias): (G, H, T, T), G = 1 when the members share their embeddings, else M; None for most families."""

        def bias(model: nn.Module, seq_len: int) -> Tensor | None:
            return self.adapter.attention_bias(self.adapter.backbone(model), seq_len)

        if bias(self.skeleton, 0) is None:  # meta tensors: free
            return None
        if not self.embeddings_per_member:
            return self._call(self.member_slice(0), bias, seq_len)[None]  # (1, H, T, T)
        return self._each_member(lambda tensors: self._call(tensors, bias, seq_len), self.member.tensors())

    def layer_attention(self, inputs: Mapping[str, Any], seq_len: int) -> list[LayerAttention] | None:
        """Each layer's mask, rotary table and position scoring (`Adapter.layer_attention`) for families that give
        them per layer (ModernBERT, DeBERTa), from member 0's tensors; else None. Position tables (DeBERTa's
        relative-distance embeddings) are embedding tensors: when the members' embeddings differ, each layer gets
        every member's table, (M, P, d), computed vmapped over members."""
        if type(self.adapter).layer_attention is Adapter.layer_attention:  # not overridden: no call at all
            return None

        def per_layer(model: nn.Module, inputs: Mapping[str, Any], seq_len: int) -> list[LayerAttention]:
            return self.adapter.layer_attention(self.adapter.backbone(model), inputs, seq_len)

        layers = self._call(self.member_slice(0), per_layer, inputs, seq_len)
        if not self.embeddings_per_member or all(layer.positions is None for layer in layers):
            return layers

        def tables(model: nn.Module, inputs: Mapping[str, Any], seq_len: int) -> Tensor:
            return torch.stack([layer.positions for layer in per_layer(model, inputs, seq_len)])  # (L, P, d)

        stacked = self._each_member(lambda t: self._call(t, tables, inputs, seq_len), self.member.tensors())
        return [layer._replace(positions=stacked[:, i]) for i, layer in enumerate(layers)]  # (M, P, d) each

    def head(self, hidden: Tensor, inputs: Mapping[str, Any]) -> Tensor:
        """Each member's own head on its own stream: hidden (M, B, T, d) -> (M, B, C) or (M, B, D)."""
        head = self.adapter.head
        return self._each_member(lambda tensors, h: self._call(tensors, head, h, inputs), self.member.tensors(), hidden)

    @staticmethod
    def _each_member(fn: Callable[..., Tensor], tensors: Mapping[str, Tensor], *batched: Tensor) -> Tensor:
        """`fn(member m's tensors, *(x[m] for x in batched))` for every member, stacked: (M, ...). vmapped; a loop
        while `torch.export` traces, since torch 2.13's vmap rule for layer_norm reads the batch size as an int and
        so fixes a dynamic batch (`hydra_ensembles.export`; under torch.compile too: a graph per batch size)."""
        if not (torch.compiler.is_exporting() or torch.compiler.is_compiling()):
            return torch.vmap(fn)(tensors, *batched)
        members = range((batched[0] if batched else next(iter(tensors.values()))).shape[0])  # tensors may be empty
        return torch.stack([fn({k: t[m] for k, t in tensors.items()}, *(x[m] for x in batched)) for m in members])

    def member_slice(self, m: int) -> dict[str, Tensor]:
        return {name: tensor[m] for name, tensor in self.member.tensors().items()}
