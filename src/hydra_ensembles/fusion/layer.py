"""One transformer layer of M pruned members, run as a single pass (paper §4.2, Fig. 2, Eq. 4-7).

Symbols: M members, B batch, T tokens, d hidden size, dh head size, Hp = the most heads any member keeps in this
layer, F MLP width, G = 1 for a tensor the members share (identical, or averaged with mlp="average"), else M.

Attention: q/k/v for all members come from one grouped matmul; member m's kept heads fill slots 0..H_m-1 of its
Hp slots and the rest are zero-padded (zero q/k/v weights and zero W_o rows, so a padded head adds exactly
nothing). All members' heads then go through one `scaled_dot_product_attention` call laid out as
(M*B, Hp, T, dh) — each member's heads attend within its own stream, as in the paper's Eq. 2-3 — built from
views of the q/k/v projection without copying.

A family whose layers share an additive score bias (MPNet's relative position bias) passes it in place of the
boolean mask: float (B, G*H, T, T), one plane per original head of G = 1 or M copies; each member's slot s then
reads the plane of the original head it holds there (`bias_index`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..adapters import Block
from .grouped import group_scale, grouped_layer_norm, grouped_linear

MLPMode = Literal["average", "stack"]
# Tensors a layer may share between members, each with its group axis G. Attention is never shared.
SHAREABLE = ("norm1", "norm2", "mlp", "scale1", "scale2")


class FusedLayer(nn.Module):
    """M members' copies of one layer. `kept_heads[m]`: the original indices of the heads member m keeps here.

    Tensors (see the module docstring for symbols):
        qkv_weight (M, d, 3*Hp*dh), qkv_bias (M, 1, 3*Hp*dh): columns [q heads | k heads | v heads]
        o_weight (M, Hp*dh, d), o_bias (M, 1, d)
        norm1_weight, norm1_bias, norm2_weight, norm2_bias (G, d)
        mlp_in_weight (G, d, F), mlp_in_bias (G, 1, F), mlp_out_weight (G, F, d), mlp_out_bias (G, 1, d)
        scale1, scale2 (G, d): layer scale (DINOv2), absent otherwise
    """

    def __init__(
        self,
        tensors: dict[str, Tensor],
        *,
        kept_heads: Sequence[Sequence[int]],
        num_heads: int,
        head_dim: int,
        scaling: float,
        norm_position: Literal["pre", "post"],
        eps: tuple[float, float],
        activation: Callable[[Tensor], Tensor],
    ):
        super().__init__()
        for name, tensor in tensors.items():
            self.register_parameter(name, nn.Parameter(tensor, requires_grad=tensor.is_floating_point()))
        if "scale1" not in tensors:
            self.scale1 = self.scale2 = None
        self.kept_heads = [list(heads) for heads in kept_heads]
        self.head_counts = [len(heads) for heads in self.kept_heads]
        self.padded_heads = max(self.head_counts, default=0)
        self.num_heads = num_heads  # heads per layer of the unpruned model
        index = torch.zeros(len(self.kept_heads), self.padded_heads, dtype=torch.long)  # padded slots: plane 0
        for m, heads in enumerate(self.kept_heads):
            index[m, : len(heads)] = torch.as_tensor(heads, dtype=torch.long)
        self.register_buffer("bias_index", index, persistent=False)  # (M, Hp), rebuilt from the head maps
        self.head_dim = head_dim
        self.scaling = scaling
        self.norm_position = norm_position
        self.eps = eps
        self.activation = activation
        self.averaged: list[str] = []  # tensors averaged over members that differ in them (set by from_blocks)

    @classmethod
    def from_blocks(
        cls, blocks: Sequence[Block], kept_heads: Sequence[Sequence[int]], mlp: MLPMode, **layer_kwargs
    ) -> FusedLayer:
        """Gather one layer from M members. `blocks[m]` keeps the heads `kept_heads[m]` (its first rows)."""
        head_counts = [len(heads) for heads in kept_heads]
        head_dim = layer_kwargs["head_dim"]
        width = max(head_counts, default=0) * head_dim  # Hp * dh
        first = blocks[0].output.weight
        members, d = len(blocks), first.shape[0]
        qkv_weight = first.new_zeros(members, d, 3 * width)
        qkv_bias = first.new_zeros(members, 1, 3 * width)
        o_weight = first.new_zeros(members, width, d)
        o_bias = first.new_zeros(members, 1, d)
        with torch.no_grad():
            for m, (block, count) in enumerate(zip(blocks, head_counts)):
                rows = count * head_dim  # a member with no heads left keeps a zero placeholder: skip it
                for j, linear in enumerate((block.query, block.key, block.value)):
                    qkv_weight[m, :, j * width : j * width + rows] = linear.weight[:rows].T
                    if linear.bias is not None:
                        qkv_bias[m, 0, j * width : j * width + rows] = linear.bias[:rows]
                o_weight[m, :rows] = block.output.weight[:, :rows].T
                if block.output.bias is not None:
                    o_bias[m, 0] = block.output.bias
        attention = {"qkv_weight": qkv_weight, "qkv_bias": qkv_bias, "o_weight": o_weight, "o_bias": o_bias}
        if all(torch.equal(t[m], t[0]) for t in attention.values() for m in range(1, members)):
            attention = {name: t[:1].clone() for name, t in attention.items()}  # identical members: one copy
        rest, averaged = _shared_or_stacked(blocks, mlp)
        layer = cls(attention | rest, kept_heads=kept_heads, **layer_kwargs)
        layer.averaged = averaged
        return layer

    def repeat(self, members: int, stack: bool) -> FusedLayer:
        """This one-member layer as the same layer of `members` members that start equal: every tensor kept once
        (stack=False: a layer of the shared body) or copied `members` times, (M, ...), so the copies can be
        trained apart (stack=True: a layer of the heads). Hydra distillation grows its student this way."""
        if len(self.kept_heads) != 1:
            raise ValueError(f"only a one-member layer can be repeated; this one has {len(self.kept_heads)} members.")
        with torch.no_grad():
            tensors = {
                name: p.detach().expand(members, *p.shape[1:]).clone() if stack else p.detach().clone()
                for name, p in self.named_parameters()
            }
        kwargs = {"num_heads": self.num_heads, "head_dim": self.head_dim, "scaling": self.scaling}
        kwargs |= {"norm_position": self.norm_position, "eps": self.eps, "activation": self.activation}
        return FusedLayer(tensors, kept_heads=self.kept_heads * members, **kwargs)

    @property
    def shared(self) -> bool:
        """True when every tensor has one copy (G = 1): the layer is the same function for every member."""
        return all(p.shape[0] == 1 for p in self.parameters()) and len({tuple(h) for h in self.kept_heads}) <= 1

    def forward(self, x: Tensor, mask: Tensor | None, queries: int | None = None) -> Tensor:
        """x: (M, B, T, d) member streams; mask: bool, (B, 1, 1|T, T) or (T, T), or None; or a score bias
        (B, G*H, T, T) (see the module docstring).

        Returns (M, B, T, d), or (M, B, q, d) with `queries=q`: only the first q token rows are computed (keys
        and values still come from all T tokens) — all a last layer needs when the head reads [CLS] only.
        """
        members, batch, tokens, d = x.shape
        flat = x.reshape(members, batch * tokens, d)  # (M, N, d), N = B*T
        heads = self.attend(self.attention_input(flat), batch, mask, queries)  # (M, B*q, Hp*dh)
        if queries is not None:
            flat = x[:, :, :queries].reshape(members, batch * queries, d)
        out = self.residuals(flat, grouped_linear(heads, self.o_weight, self.o_bias))
        return out.view(members, batch, queries or tokens, d)

    def ablation_candidates(
        self, x: Tensor, mask: Tensor | None, slots: Sequence[int], queries: int | None = None
    ) -> Tensor:
        """This layer's output once per candidate, each with one head turned off (W_o's block zeroed, §D.1.2).

        For a shared layer (one member). x: (1, B, T, d); `slots` are head positions within the layer. The
        attention runs once; candidate c's attention output is the full output minus head c's term
        z_c W_o^(c). Returns (C, B, T, d), or (C, B, q, d) with `queries=q` (see `forward`).
        """
        _, batch, tokens, d = x.shape
        rows = queries or tokens
        heads = self.attend(self.attention_input(x.reshape(1, batch * tokens, d)), batch, mask, queries)
        full = grouped_linear(heads, self.o_weight, self.o_bias)  # (1, B*rows, d)
        per_head = heads[0].view(-1, self.padded_heads, self.head_dim)  # (B*rows, Hp, dh)
        blocks = self.o_weight[0].view(self.padded_heads, self.head_dim, d)  # (Hp, dh, d)
        index = torch.as_tensor(list(slots), device=x.device)
        terms = torch.einsum("nhk,hkd->hnd", per_head[:, index], blocks[index])  # (C, B*rows, d)
        residual = x[:, :, :rows].reshape(1, batch * rows, d)
        return self.residuals(residual, full - terms).view(len(index), batch, rows, d)

    def attention_input(self, x: Tensor) -> Tensor:
        return self.norm(x, 1) if self.norm_position == "pre" else x

    def residuals(self, x: Tensor, attention: Tensor) -> Tensor:
        """Everything after the attention projection: residuals, norms, MLP. x (M|1, N, d), attention (M, N, d)."""
        if self.norm_position == "pre":
            x = x + group_scale(attention, self.scale1)
            return x + group_scale(self.mlp(self.norm(x, 2)), self.scale2)
        x = self.norm(x + attention, 1)
        return self.norm(x + self.mlp(x), 2)

    def attend(self, x: Tensor, batch: int, mask: Tensor | None, queries: int | None = None) -> Tensor:
        """All members' heads before the output projection. x: (M, N, d) -> (M, B*q, Hp*dh), q = queries or T."""
        members, rows, _ = x.shape
        tokens, heads, head_dim = rows // batch, self.padded_heads, self.head_dim
        out_rows = batch * (queries or tokens)
        if heads == 0:  # no member keeps a head here: the block adds W_o's bias only
            return x.new_zeros(members, out_rows, 0)
        qkv = grouped_linear(x, self.qkv_weight, self.qkv_bias)  # (M, N, 3*Hp*dh)
        qkv = qkv.view(members * batch, tokens, 3, heads, head_dim)  # (M*B, T, 3, Hp, dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (M*B, Hp, T, dh), views: no copy
        if queries is not None:
            q = q[:, :, :queries]  # (M*B, Hp, q, dh)
            if mask is not None and mask.shape[-2] > 1:  # a causal mask has one row per query
                mask = mask[..., :queries, :]
        if mask is not None and mask.is_floating_point():
            mask = self.member_bias(mask, members)  # (M*B, Hp, q|T, T)
        elif mask is not None and mask.dim() == 4 and members > 1:  # (B, 1, 1|T, T) -> (M*B, 1, 1|T, T)
            mask = mask.expand(members, *mask.shape).reshape(members * batch, *mask.shape[1:])
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)  # (M*B, Hp, q, dh)
        return z.transpose(1, 2).reshape(members, out_rows, heads * head_dim)  # (M, B*q, Hp*dh)

    def member_bias(self, bias: Tensor, members: int) -> Tensor:
        """Each member's slots' planes of a shared score bias: (B, G*H, R, T) -> (M*B, Hp, R, T)."""
        index = self.bias_index[:members]  # (M, Hp); a one-member engine has M = 1
        if bias.shape[1] > self.num_heads:  # G = M copies: member m reads planes m*H..(m+1)*H-1
            index = index + self.num_heads * torch.arange(members, device=index.device)[:, None]
        planes = bias[:, index.flatten()]  # (B, M*Hp, R, T)
        planes = planes.view(bias.shape[0], members, self.padded_heads, *bias.shape[2:]).transpose(0, 1)
        return planes.reshape(members * bias.shape[0], self.padded_heads, *bias.shape[2:])

    def mlp(self, x: Tensor) -> Tensor:
        """x: (M, N, d) -> (M, N, d)."""
        hidden = self.activation(grouped_linear(x, self.mlp_in_weight, self.mlp_in_bias))  # (M, N, F)
        return grouped_linear(hidden, self.mlp_out_weight, self.mlp_out_bias)

    def norm(self, x: Tensor, which: int) -> Tensor:
        weight, bias = getattr(self, f"norm{which}_weight"), getattr(self, f"norm{which}_bias")
        return grouped_layer_norm(x, weight, bias, self.eps[which - 1])


def _shared_or_stacked(blocks: Sequence[Block], mlp: MLPMode) -> tuple[dict[str, Tensor], list[str]]:
    """Norm, MLP and layer-scale tensors: one copy when all members hold the same values (exact), otherwise the
    members' average (mlp="average", the paper's merged MLP) or all of them stacked (mlp="stack", exact).
    Also returns the names of the tensors averaged although the members differ in them (the approximation)."""
    groups = {
        "norm1": {"norm1_weight": [b.norm1.weight for b in blocks], "norm1_bias": [b.norm1.bias for b in blocks]},
        "norm2": {"norm2_weight": [b.norm2.weight for b in blocks], "norm2_bias": [b.norm2.bias for b in blocks]},
        "mlp": {
            "mlp_in_weight": [b.mlp_in.weight.T for b in blocks],  # (d, F)
            "mlp_in_bias": [b.mlp_in.bias[None] for b in blocks],  # (1, F)
            "mlp_out_weight": [b.mlp_out.weight.T for b in blocks],  # (F, d)
            "mlp_out_bias": [b.mlp_out.bias[None] for b in blocks],  # (1, d)
        },
    }
    if blocks[0].scale1 is not None:
        groups["scale1"] = {"scale1": [b.scale1 for b in blocks]}
        groups["scale2"] = {"scale2": [b.scale2 for b in blocks]}
    out: dict[str, Tensor] = {}
    averaged: list[str] = []
    for group in groups.values():
        shapes = {name: {tuple(t.shape) for t in ts} for name, ts in group.items()}
        uneven = {name: sorted(s) for name, s in shapes.items() if len(s) > 1}
        if uneven:
            raise ValueError(f"members differ in the shape of {uneven}; fusion needs equal MLP widths.")
        combined, approximate = share_average_or_stack(group, mlp)
        out |= combined
        averaged += list(group) if approximate else []
    return out, averaged


def share_average_or_stack(group: Mapping[str, Sequence[Tensor]], mlp: MLPMode) -> tuple[dict[str, Tensor], bool]:
    """The one rule for what members may share (here and for the embeddings, `ensemble._outer_tensors`).

    A group of tensors that go together (a layer norm's weight and bias, an MLP's four tensors; M of each) is kept
    once, (1, ...), when every member holds the same values (exact); otherwise it is the members' average, (1, ...)
    (mlp="average", the paper's merged MLP: an approximation), or all of them stacked, (M, ...) (mlp="stack",
    exact). Returns the combined tensors and whether differing tensors were averaged."""
    with torch.no_grad():
        identical = all(torch.equal(t, ts[0]) for ts in group.values() for t in ts)
        if identical:
            return {name: ts[0].detach().clone()[None] for name, ts in group.items()}, False
        if mlp == "average":
            return {
                name: torch.stack([t.detach() for t in ts]).mean(0, keepdim=True) for name, ts in group.items()
            }, True
        return {name: torch.stack([t.detach() for t in ts]).clone() for name, ts in group.items()}, False
