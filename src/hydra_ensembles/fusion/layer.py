"""One transformer layer of M pruned members, run as a single pass (paper §4.2, Fig. 2, Eq. 4-7).

Symbols: M members, B batch, T tokens, d hidden size, dh head size, H_m the heads member m keeps in this layer,
Hp = max_m H_m, H_tot = sum_m H_m, F MLP width, G = 1 for a tensor the members share (identical, or averaged with
mlp="average"), else M.

Attention has two layouts, chosen per layer from the head counts and the device (`ragged_by_default`):

- padded, when every member keeps the same number of heads (Hp = H_m: the padding is empty), and on a GPU. q/k/v
  for all members come from one grouped matmul; all members' heads go through one `scaled_dot_product_attention`
  call laid out as (M*B, Hp, T, dh) — each member's heads attend within its own stream, as in the paper's Eq. 2-3 —
  built from views of the q/k/v projection without copying. Members with fewer heads than Hp fill the rest with
  zero q/k/v weights and zero W_o rows (exactly nothing, at the FLOPs of Hp heads; `lay_out(False)` builds that,
  and ensembles saved before the ragged layout hold it).
- ragged, when the counts differ, on a CPU. Member m's H_m heads own a block of columns of one q/k/v matrix and of
  rows of one W_o (member-major, H_tot heads in all); its projections run as M plain matmuls on its own stream,
  and all H_tot heads go through one `scaled_dot_product_attention` call laid out as (B, H_tot, T, dh): a head
  attends within its member's stream because its q, k and v all come from that stream.

A family whose layers share an additive score bias (MPNet's relative position bias) passes it in place of the
boolean mask: float (B, G*H, T, T), one plane per original head of G = 1 or M copies; each head then reads the
plane of the original head it is (`bias_index`). A family whose layers differ in their masks or take rotary
positions (ModernBERT) passes each layer its `LayerAttention` (the adapter's `layer_attention`): its mask, and
(cos, sin) rotated into every head's q and k before the attention. A family whose heads score positions through
their own projections (DeBERTa's disentangled c2p and p2c terms) passes a position table and a `score_bias`
function: each head projects the table through its own q and k columns of the layer (so a member's heads use
that member's weights, in either layout) and the function turns q, k and those projections into additive scores,
which go to `scaled_dot_product_attention` as a float mask (the padding mask folded in).

The MLP is act(x W_in + b_in) W_out + b_out, or gated (GeGLU, ModernBERT: `mlp_gate_weight` present)
(act(x W_in + b_in) * (x W_gate + b_gate)) W_out + b_out. A bias the members lack (ModernBERT has none) and a
norm they lack (ModernBERT's first layer has an Identity before its attention) are absent here too: no tensor,
no term, so that nothing trains what the HF members cannot hold.

A layer the model runs a convolution beside (DeBERTa-v2-xlarge's `ConvLayer` after layer 0: `InputConv`) mixes
it into its output y: norm(y + act(conv(x) zeroed at padding)) * mask, x the layer's input, mask (B, T) the
padding mask read off the layer's boolean attention mask. Per-member kernels run as one grouped convolution
(`grouped_conv1d`), not a loop over members. With `queries` the convolution still reads all T input rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..adapters import Block
from ..adapters.base import InputConv, LayerAttention
from .grouped import group_scale, grouped_conv1d, grouped_layer_norm, grouped_linear, ragged_linear

MLPMode = Literal["average", "stack"]
# Tensors a layer may share between members, each with its group axis G. Attention is never shared.
SHAREABLE = ("norm1", "norm2", "mlp", "scale1", "scale2", "conv")
# What a layer's attention takes besides its input: a mask, a score bias (see the module docstring) or, per layer,
# a `LayerAttention` (mask and rotary positions)
AttentionInputs = Tensor | LayerAttention | None
ATTENTION = ("qkv_weight", "qkv_bias", "o_weight", "o_bias")
# Tensors a layer holds only where its family has them
OPTIONAL = ("qkv_bias", "o_bias", "norm1_weight", "scale1", "scale2", "mlp_gate_weight")
OPTIONAL += tuple(f"{prefix}_bias" for prefix in ("norm1", "norm2", "mlp_in", "mlp_gate", "mlp_out"))
OPTIONAL += ("conv_weight", "conv_bias", "conv_norm_weight", "conv_norm_bias")


class ConvConstants(NamedTuple):
    """What a layer's input convolution (`adapters.base.InputConv`) is besides its tensors, whose shapes give its
    kernel size and groups: the activation after it and the eps of the norm that mixes it in."""

    activation: Callable[[Tensor], Tensor]
    eps: float

    @classmethod
    def of(cls, conv: InputConv | None) -> ConvConstants | None:
        return None if conv is None else cls(conv.activation, conv.norm.eps)


def ragged_by_default(head_counts: Sequence[int], device: torch.device) -> bool:
    """The layout a layer takes unless told: ragged where its members keep different numbers of heads and its
    weights sit on a CPU, padded otherwise. On a CPU ragged computes fewer FLOPs at no cost in latency (MiniLM,
    M = 3 circuit-like members: 2.27x Single's FLOPs, padded 2.39x). On a GPU, where small matmuls are
    launch-bound, its M per-member projections cost more than the padded heads they save: on an H100 in bf16
    (ViT-B/16 shapes, M = 3 circuit-like members, 4 % fewer FLOPs ragged) ragged took 1.37-1.42x padded's latency
    at batch 1-4 and 1.08-1.10x at 32-128; in fp32 1.39x at batch 1, 0.98x from 32 on
    (benchmarks/results/gpu/h100-ragged.md)."""
    return len(set(head_counts)) > 1 and torch.device(device).type == "cpu"


class MemberAttention(NamedTuple):
    """One member's attention in a layer, keeping H_m heads: its block of either layout.

    qkv_weight (d, n*H_m*dh) with columns [q heads | k heads | v heads | further per-head rows], qkv_bias
    (1, n*H_m*dh), o_weight (H_m*dh, d), o_bias (1, d); n = 3 + the family's further per-head projections
    (`Block.position_projections`: DeBERTa's W_pk, W_pq, applied to its position table only); a bias is None
    where the HF layer has none (q, k and v: none of them)."""

    qkv_weight: Tensor
    qkv_bias: Tensor | None
    o_weight: Tensor
    o_bias: Tensor | None

    @classmethod
    def from_block(cls, block: Block, count: int, head_dim: int) -> MemberAttention:
        """The first `count` heads of an HF layer (a member with no heads left keeps a zero placeholder: skipped)."""
        rows = count * head_dim
        projections = block.fused_rows()  # (Linear, its rows) for q, k, v and any further per-head projection
        weight = torch.cat([linear.weight[own][:rows] for linear, own in projections]).T  # (d, n*H_m*dh)
        biases = [_bias_rows(linear, own, rows, weight) for linear, own in projections]
        qkv_bias = None if all(linear.bias is None for linear, _ in projections) else torch.cat(biases)[None]
        o_bias = None if block.output.bias is None else block.output.bias[None]
        return cls(weight, qkv_bias, block.output.weight[:, :rows].T, o_bias)

    def write_block(self, block: Block) -> None:
        """Into an HF layer that keeps these H_m heads first (the inverse of `from_block`)."""
        rows = self.o_weight.shape[0]
        for j, (linear, own) in enumerate(block.fused_rows()):
            linear.weight[own][:rows].copy_(self.qkv_weight[:, j * rows : (j + 1) * rows].T)
            if linear.bias is not None and self.qkv_bias is not None:
                linear.bias[own][:rows].copy_(self.qkv_bias[0, j * rows : (j + 1) * rows])
        block.output.weight[:, :rows].copy_(self.o_weight.T)
        if block.output.bias is not None and self.o_bias is not None:
            block.output.bias.copy_(self.o_bias[0])


class FusedLayer(nn.Module):
    """M members' copies of one layer. `kept_heads[m]`: the original indices of the heads member m keeps here.

    Tensors (see the module docstring for symbols and layouts):
        padded: qkv_weight (G, d, n*Hp*dh), qkv_bias (G, 1, n*Hp*dh): columns [q heads | k heads | v heads]
            (and n - 3 further per-head blocks, see `MemberAttention`); o_weight (G, Hp*dh, d), o_bias (G, 1, d)
        ragged (no group axis: each tensor holds every member's block): qkv_weight (d, n*H_tot*dh),
            qkv_bias (n*H_tot*dh,): member m's columns [q heads | k heads | v heads | ...] after those of members
            0..m-1; o_weight (H_tot*dh, d), its rows in the same order; o_bias (M, 1, d)
        norm1_weight, norm1_bias, norm2_weight, norm2_bias (G, d): norm1 absent where the layer has none
        mlp_in_weight (G, d, F), mlp_in_bias (G, 1, F), mlp_out_weight (G, F, d), mlp_out_bias (G, 1, d)
        mlp_gate_weight (G, d, F), mlp_gate_bias (G, 1, F): a gated MLP's gate (ModernBERT), absent otherwise
        scale1, scale2 (G, d): layer scale (DINOv2), absent otherwise
        conv_weight (G, d, d/g, k), conv_bias (G, d), conv_norm_weight, conv_norm_bias (G, d): the convolution
            run beside the layer (see the module docstring; g groups, kernel k), absent otherwise; `conv` holds
            its constants
        every bias is absent where the members have none (ModernBERT)
    `tensors` may hold the attention in either layout (ensembles saved before the ragged layout are padded); the
    layer converts it to the one `ragged` names (None: `ragged_by_default`, from the head counts and the device).
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
        projections: int = 3,
        ragged: bool | None = None,
        conv: ConvConstants | None = None,
        biased: Sequence[bool] | None = None,
    ):
        super().__init__()
        self.kept_heads = [list(heads) for heads in kept_heads]
        self.head_counts = [len(heads) for heads in self.kept_heads]
        self.padded_heads = max(self.head_counts, default=0)  # Hp
        self.ragged = tensors["qkv_weight"].dim() == 2  # as stored; laid out as asked below
        self.head_dim = head_dim
        self.projections = projections  # n: per-head projection blocks of qkv_weight (see `MemberAttention`)
        for name, tensor in tensors.items():
            self.register_parameter(name, nn.Parameter(tensor, requires_grad=tensor.is_floating_point()))
        for name in OPTIONAL:
            if name not in tensors:
                setattr(self, name, None)
        self.num_heads = num_heads  # heads per layer of the unpruned model
        self._register_bias_index()
        self.scaling = scaling
        self.norm_position = norm_position
        self.eps = eps
        self.activation = activation
        if (conv is None) != (self.conv_weight is None):
            raise ValueError(
                f"a fused layer's convolution tensors and constants go together: tensors {self.conv_weight is not None}"
                f", constants {conv is not None}; rebuild the layer from its model's config (HydraEnsemble)."
            )
        self.conv = conv
        self.averaged: list[str] = []  # tensors averaged over members that differ in them (set by from_blocks)
        self.biased = None if biased is None else tuple(biased)  # which per-head projections have a bias in HF
        self.lay_out(ragged_by_default(self.head_counts, self.qkv_weight.device) if ragged is None else ragged)
        self._register_bias_mask()

    def _register_bias_index(self) -> None:
        """Which plane of a shared score bias each head reads, rebuilt from the head maps (not saved).

        padded: bias_index (M, Hp), a padded slot reads plane 0. ragged: bias_index (H_tot,), and head_member
        (H_tot,) the member each head belongs to."""
        device = self.qkv_weight.device
        if self.ragged:
            heads = [head for kept in self.kept_heads for head in kept]
            owners = [m for m, kept in enumerate(self.kept_heads) for _ in kept]
            self.register_buffer("bias_index", torch.as_tensor(heads, dtype=torch.long, device=device), False)
            self.register_buffer("head_member", torch.as_tensor(owners, dtype=torch.long, device=device), False)
            return
        self._buffers.pop("head_member", None)  # laid out padded again: no longer read
        index = torch.zeros(len(self.kept_heads), self.padded_heads, dtype=torch.long)
        for m, heads in enumerate(self.kept_heads):
            index[m, : len(heads)] = torch.as_tensor(heads, dtype=torch.long)
        self.register_buffer("bias_index", index.to(device), persistent=False)

    def _register_bias_mask(self) -> None:
        """qkv_bias_mask: 1 where qkv_bias holds a bias entry of an HF projection, 0 where it holds the zero of a
        projection without one (DINOv3's key) — in qkv_bias's layout, or None when every projection has its
        bias. The forward multiplies it in (`_qkv_bias`): those zeros get no gradient, so that nothing trains
        what the HF members cannot hold (with rotary positions a key bias would move the scores)."""
        if self.qkv_bias is None or self.biased is None or all(self.biased):
            self.register_buffer("qkv_bias_mask", None, persistent=False)
            return
        counts = [self.padded_heads] if not self.ragged else self.head_counts  # padded: the same slots for all
        mask = torch.cat([torch.full((n * self.head_dim,), float(b)) for n in counts for b in self.biased])
        shape = (-1,) if self.ragged else (1, 1, -1)
        self.register_buffer("qkv_bias_mask", mask.view(shape).to(self.qkv_bias), persistent=False)

    def _qkv_bias(self) -> Tensor | None:
        """qkv_bias as the forward uses it: the zeros of projections without a bias held at zero (`qkv_bias_mask`)."""
        if self.qkv_bias is None or self.qkv_bias_mask is None:
            return self.qkv_bias
        return self.qkv_bias * self.qkv_bias_mask

    @classmethod
    def from_blocks(
        cls, blocks: Sequence[Block], kept_heads: Sequence[Sequence[int]], mlp: MLPMode, **layer_kwargs
    ) -> FusedLayer:
        """Gather one layer from M members. `blocks[m]` keeps the heads `kept_heads[m]` (its first rows)."""
        head_counts = [len(heads) for heads in kept_heads]
        with torch.no_grad():  # _attention_tensors copies the members' blocks
            members = [MemberAttention.from_block(b, n, layer_kwargs["head_dim"]) for b, n in zip(blocks, head_counts)]
            ragged = ragged_by_default(head_counts, members[0].qkv_weight.device)
            attention = _attention_tensors(members, ragged, layer_kwargs.get("projections", 3))
        if not ragged and all(torch.equal(t[m], t[0]) for t in attention.values() for m in range(1, len(blocks))):
            attention = {name: t[:1].clone() for name, t in attention.items()}  # identical members: one copy
        rest, averaged = _shared_or_stacked(blocks, mlp)
        layer = cls(attention | rest, kept_heads=kept_heads, **layer_kwargs)
        layer.averaged = averaged
        return layer

    def member_attention(self, m: int, tensors: Mapping[str, Tensor] | None = None) -> MemberAttention:
        """Member m's attention block (views), of this layer's parameters or of `tensors` laid out as they are
        (their gradients, say)."""
        source = dict(self.named_parameters()) if tensors is None else tensors
        return _member_attention(source, self.head_counts, self.head_dim, m, self.projections)

    def lay_out(self, ragged: bool) -> FusedLayer:
        """This layer with its attention in the given layout, in place (the same function). Only the q/k/v and
        W_o parameters are replaced (each keeping its requires_grad); every other parameter, the module and its
        hooks stay as they are. Returns this layer."""
        if ragged == self.ragged:
            return self
        converted = self._attention_in(ragged)
        for name in ("qkv_weight", "qkv_bias", "o_weight"):  # o_bias (M, 1, d) is the same in both layouts
            if getattr(self, name) is not None:
                setattr(self, name, nn.Parameter(converted[name], requires_grad=getattr(self, name).requires_grad))
        self.ragged = ragged
        self._register_bias_index()
        if hasattr(self, "qkv_bias_mask"):  # laid out again after construction
            self._register_bias_mask()
        return self

    def canonical_tensors(self) -> dict[str, Tensor]:
        """This layer's q/k/v and W_o (state-dict names) in the padded layout, the one the same weights take on
        every device; empty where the layer is padded already. `io.weights_digest` reads them, so that a digest
        names the weights and not the device's layout."""
        if not self.ragged:
            return {}
        return {name: t for name, t in self._attention_in(ragged=False).items() if name != "o_bias"}

    def padding_parameters(self) -> int:
        """How many of this layer's stored numbers are no member's parameters, so not counted as such
        (`cost.count_parameters`): the zero heads of the padded layout (members keeping fewer than Hp heads here)
        and the zero biases of the members' projections that have none (`qkv_bias_mask`)."""
        return self._padded_heads_parameters() + self._absent_bias_parameters()

    def _padded_heads_parameters(self) -> int:
        if self.ragged or len(set(self.head_counts)) <= 1 or self.qkv_weight.shape[0] != len(self.head_counts):
            return 0
        missing = sum(self.padded_heads - count for count in self.head_counts) * self.head_dim  # padded columns
        d = self.o_weight.shape[-1]
        column = self.projections * (d + (self.qkv_bias is not None))  # q/k/v(/...) weight column and bias entry
        return missing * (column + d)  # and W_o's row

    def _absent_bias_parameters(self) -> int:
        """The members' heads' entries of qkv_bias for projections without a bias (the padded slots: above)."""
        if self.qkv_bias_mask is None:
            return 0
        stored = sum(self.head_counts) if self.ragged or self.qkv_bias.shape[0] > 1 else self.head_counts[0]
        return stored * self.head_dim * self.biased.count(False)

    @torch.no_grad()
    def _attention_in(self, ragged: bool) -> dict[str, Tensor]:
        members = [self.member_attention(m) for m in range(len(self.kept_heads))]
        return _attention_tensors(members, ragged, self.projections)

    def _constants(self) -> dict:
        kwargs = {"num_heads": self.num_heads, "head_dim": self.head_dim, "scaling": self.scaling}
        kwargs |= {"projections": self.projections, "conv": self.conv, "biased": self.biased}
        return kwargs | {"norm_position": self.norm_position, "eps": self.eps, "activation": self.activation}

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
        return FusedLayer(tensors, kept_heads=self.kept_heads * members, **self._constants())

    @property
    def shared(self) -> bool:
        """True when every tensor has one copy (G = 1): the layer is the same function for every member."""
        return all(p.shape[0] == 1 for p in self.parameters()) and len({tuple(h) for h in self.kept_heads}) <= 1

    def forward(self, x: Tensor, mask: AttentionInputs, queries: int | None = None) -> Tensor:
        """x: (M, B, T, d) member streams; mask: bool, (B, 1, 1|T, T) or (T, T), or None; or a score bias
        (B, G*H, T, T); or a `LayerAttention` (see the module docstring).

        Returns (M, B, T, d), or (M, B, q, d) with `queries=q`: only the first q token rows are computed (keys
        and values still come from all T tokens) — all a last layer needs when the head reads [CLS] only.
        """
        members, batch, tokens, d = x.shape
        flat = x.reshape(members, batch * tokens, d)  # (M, N, d), N = B*T
        attention = self.attention(self.attention_input(flat), batch, mask, queries)  # (M, B*q, d)
        if queries is not None:
            flat = x[:, :, :queries].reshape(members, batch * queries, d)
        out = self.residuals(flat, attention)
        return self.mix_input(x, out.view(members, batch, queries or tokens, d), mask)

    def attention(self, x: Tensor, batch: int, mask: AttentionInputs, queries: int | None = None) -> Tensor:
        """The attention block's output (after W_o, before the residual). x: (M, N, d) -> (M, B*q, d)."""
        if self.ragged:
            heads = self.attend_ragged(x, batch, mask, queries)  # (B*q, H_tot*dh)
            widths = [count * self.head_dim for count in self.head_counts]
            return ragged_linear(heads, self.o_weight, self.o_bias, widths)
        return grouped_linear(self.attend(x, batch, mask, queries), self.o_weight, self.o_bias)

    def ablation_candidates(
        self, x: Tensor, mask: AttentionInputs, slots: Sequence[int], queries: int | None = None
    ) -> Tensor:
        """This layer's output once per candidate, each with one head turned off (W_o's block zeroed, §D.1.2).

        For a shared layer (one member). x: (1, B, T, d); `slots` are head positions within the layer. The
        attention runs once; candidate c's attention output is the full output minus head c's term
        z_c W_o^(c). Returns (C, B, T, d), or (C, B, q, d) with `queries=q` (see `forward`).
        """
        if len(self.kept_heads) != 1:
            raise ValueError(
                f"ablation candidates are scored on a one-member layer; this one has {len(self.kept_heads)} members."
            )
        _, batch, tokens, d = x.shape
        rows = queries or tokens
        heads = self.attend(self.attention_input(x.reshape(1, batch * tokens, d)), batch, mask, queries)
        full = grouped_linear(heads, self.o_weight, self.o_bias)  # (1, B*rows, d)
        per_head = heads[0].view(-1, self.padded_heads, self.head_dim)  # (B*rows, Hp, dh)
        blocks = self.o_weight[0].view(self.padded_heads, self.head_dim, d)  # (Hp, dh, d)
        index = torch.as_tensor(list(slots), device=x.device)
        terms = torch.einsum("nhk,hkd->hnd", per_head[:, index], blocks[index])  # (C, B*rows, d)
        residual = x[:, :, :rows].reshape(1, batch * rows, d)
        out = self.residuals(residual, full - terms).view(len(index), batch, rows, d)
        return self.mix_input(x, out, mask)  # every candidate reads the same input

    def mix_input(self, x: Tensor, out: Tensor, mask: AttentionInputs) -> Tensor:
        """The input convolution mixed into the layer's output, where the layer has one (see the module
        docstring); `out` as it is otherwise. x (1|M, B, T, d): the layer's input; out (C, B, q, d): its first q
        token rows, C = M members, or C candidates of one member from one input x. Returns (C, B, q, d)."""
        if self.conv is None:
            return out
        streams, batch, rows, d = out.shape
        conv = grouped_conv1d(x, self.conv_weight, self.conv_bias)[:, :, :rows]  # (1|M, B, q, d): all T rows read
        keep = _token_mask(_split(mask).mask)  # (1|B, T, 1) or None
        keep = None if keep is None else keep[:, :rows]
        conv = self.conv.activation(conv if keep is None else conv.masked_fill(~keep, 0))
        mixed = (out + conv).reshape(streams, batch * rows, d)
        mixed = grouped_layer_norm(mixed, self.conv_norm_weight, self.conv_norm_bias, self.conv.eps)
        mixed = mixed.view(streams, batch, rows, d)
        return mixed if keep is None else mixed * keep.to(mixed.dtype)

    def attention_input(self, x: Tensor) -> Tensor:
        return self.norm(x, 1) if self.norm_position == "pre" else x

    def residuals(self, x: Tensor, attention: Tensor) -> Tensor:
        """Everything after the attention projection: residuals, norms, MLP. x (M|1, N, d), attention (M, N, d)."""
        if self.norm_position == "pre":
            x = x + group_scale(attention, self.scale1)
            return x + group_scale(self.mlp(self.norm(x, 2)), self.scale2)
        x = self.norm(x + attention, 1)
        return self.norm(x + self.mlp(x), 2)

    def attend(self, x: Tensor, batch: int, mask: AttentionInputs, queries: int | None = None) -> Tensor:
        """Padded layout: all members' heads before the output projection. x: (M, N, d) -> (M, B*q, Hp*dh),
        q = queries or T."""
        members, rows, _ = x.shape
        tokens, heads, head_dim = rows // batch, self.padded_heads, self.head_dim
        out_rows = batch * (queries or tokens)
        if heads == 0:  # no member keeps a head here: the block adds W_o's bias only
            return x.new_zeros(members, out_rows, 0)
        width = 3 * heads * head_dim  # the q, k, v columns (further per-head blocks project positions only)
        bias = None if self.qkv_bias is None else self._qkv_bias()[..., :width]
        qkv = grouped_linear(x, self.qkv_weight[..., :width], bias)  # (M, N, 3*Hp*dh)
        qkv = qkv.view(members * batch, tokens, 3, heads, head_dim)  # (M*B, T, 3, Hp, dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (M*B, Hp, T, dh), views: no copy
        inputs = _split(mask)
        scores = None if inputs.score_bias is None else self.position_scores(inputs, q, k, members)
        mask, rotary = inputs.mask, inputs.rotary
        q, mask = _first_queries(q, mask, queries)  # (M*B, Hp, q, dh)
        if rotary is not None:
            q, k = _rotate(q, rotary, members), _rotate(k, rotary, members)
        if mask is not None and mask.is_floating_point():
            mask = self.member_bias(mask, members)  # (M*B, Hp, q|T, T)
        elif mask is not None and mask.dim() == 4 and members > 1:  # (B, 1, 1|T, T) -> (M*B, 1, 1|T, T)
            mask = mask.expand(members, *mask.shape).reshape(members * batch, *mask.shape[1:])
        if scores is not None:
            mask = _with_scores(scores, mask, queries)  # (M*B, Hp, q, T)
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)  # (M*B, Hp, q, dh)
        return z.transpose(1, 2).reshape(members, out_rows, heads * head_dim)  # (M, B*q, Hp*dh)

    def attend_ragged(self, x: Tensor, batch: int, mask: AttentionInputs, queries: int | None = None) -> Tensor:
        """Ragged layout: all members' heads before the output projection. x: (M, N, d) -> (B*q, H_tot*dh),
        member m's heads in its block of columns, q = queries or T."""
        tokens, head_dim = x.shape[1] // batch, self.head_dim
        qkv_bias = self._qkv_bias()  # once, not per member
        parts, start = [], 0
        for m, count in enumerate(self.head_counts):
            begin = self.projections * start * head_dim  # member m's block; its q, k, v columns come first
            columns = slice(begin, begin + 3 * count * head_dim)
            start += count
            if count:  # member m's q/k/v from its own stream: (N, 3*H_m*dh)
                weight = self.qkv_weight[:, columns]
                bias = None if qkv_bias is None else qkv_bias[columns]
                qkv = x[m] @ weight if bias is None else torch.addmm(bias, x[m], weight)
                parts.append(qkv.view(batch, tokens, 3, count, head_dim))  # (B, T, 3, H_m, dh)
        qkv = torch.cat(parts, dim=3)  # (B, T, 3, H_tot, dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H_tot, T, dh), views: no copy
        inputs = _split(mask)
        scores = None if inputs.score_bias is None else self.position_scores_ragged(inputs, q, k)
        mask, rotary = inputs.mask, inputs.rotary
        q, mask = _first_queries(q, mask, queries)  # (B, H_tot, q, dh)
        if rotary is not None:
            q, k = _rotate(q, rotary), _rotate(k, rotary)
        if mask is not None and mask.is_floating_point():
            mask = self.head_bias(mask)  # (B, H_tot, q|T, T); a boolean mask broadcasts over the heads as it is
        if scores is not None:
            mask = _with_scores(scores, mask, queries)  # (B, H_tot, q, T)
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)  # (B, H_tot, q, dh)
        return z.transpose(1, 2).reshape(-1, start * head_dim)  # (B*q, H_tot*dh)

    def position_scores(self, inputs: LayerAttention, q: Tensor, k: Tensor, members: int) -> Tensor:
        """Padded layout: the family's score bias of every slot, from its own projections of the position table
        through the blocks `position_blocks` names (no other: their FLOPs are the members' own).
        q, k (M*B, Hp, T, dh) -> (M*B, Hp, T, T)."""
        table = inputs.positions  # (P, d), or (M, P, d): each member's own
        table = table if table.dim() == 3 else table.expand(self.qkv_weight.shape[0], *table.shape)  # (G', P, d)
        groups, positions, heads, head_dim = table.shape[0], table.shape[1], self.padded_heads, self.head_dim
        qkv_bias = self._qkv_bias()  # once, not per block

        def project(j: int | None) -> Tensor | None:  # block j of every slot: (G', 1, Hp, P, dh)
            if j is None:
                return None
            columns = slice(j * heads * head_dim, (j + 1) * heads * head_dim)
            bias = None if qkv_bias is None else qkv_bias[..., columns]
            pos = grouped_linear(table, self.qkv_weight[..., columns], bias)  # (G', P, Hp*dh), G' = M if either has M
            return pos.view(groups, 1, positions, heads, head_dim).transpose(2, 3)

        per_member = [t.reshape(members, -1, *t.shape[1:]) for t in (q, k)]  # (M, B, Hp, T, dh)
        pos_q, pos_k = (project(j) for j in inputs.position_blocks)
        return inputs.score_bias(*per_member, pos_q, pos_k).flatten(0, 1)

    def position_scores_ragged(self, inputs: LayerAttention, q: Tensor, k: Tensor) -> Tensor:
        """Ragged layout: as `position_scores`, each head projecting the table through its member's columns.
        q, k (B, H_tot, T, dh) -> (B, H_tot, T, T)."""
        table = inputs.positions  # (P, d), or (M, P, d): each member's own
        qkv_bias = self._qkv_bias()  # once, not per member and block

        def project(j: int | None) -> Tensor | None:  # block j of every head: (H_tot, P, dh)
            if j is None:
                return None
            parts, start = [], 0
            for m, count in enumerate(self.head_counts):  # member m's columns [q | k | v heads | ...] follow 0..m-1's
                begin = (self.projections * start + j * count) * self.head_dim  # its block j
                columns = slice(begin, begin + count * self.head_dim)
                start += count
                own = table[m] if table.dim() == 3 else table  # (P, d)
                weight = self.qkv_weight[:, columns]
                pos = own @ weight if qkv_bias is None else torch.addmm(qkv_bias[columns], own, weight)
                parts.append(pos.view(own.shape[0], count, self.head_dim))  # (P, H_m, dh)
            return torch.cat(parts, dim=1).transpose(0, 1)

        pos_q, pos_k = (project(j) for j in inputs.position_blocks)
        return inputs.score_bias(q, k, pos_q, pos_k)

    def member_bias(self, bias: Tensor, members: int) -> Tensor:
        """Padded layout: each member's slots' planes of a shared score bias: (B, G*H, R, T) -> (M*B, Hp, R, T)."""
        index = self.bias_index[:members]  # (M, Hp); a one-member engine has M = 1
        if bias.shape[1] > self.num_heads:  # G = M copies: member m reads planes m*H..(m+1)*H-1
            index = index + self.num_heads * torch.arange(members, device=index.device)[:, None]
        planes = bias[:, index.flatten()]  # (B, M*Hp, R, T)
        planes = planes.view(bias.shape[0], members, self.padded_heads, *bias.shape[2:]).transpose(0, 1)
        return planes.reshape(members * bias.shape[0], self.padded_heads, *bias.shape[2:])

    def head_bias(self, bias: Tensor) -> Tensor:
        """Ragged layout: each head's plane of a shared score bias: (B, G*H, R, T) -> (B, H_tot, R, T)."""
        index = self.bias_index  # (H_tot,)
        if bias.shape[1] > self.num_heads:  # G = M copies: member m's heads read planes m*H..(m+1)*H-1
            index = index + self.num_heads * self.head_member
        return bias[:, index]

    def mlp(self, x: Tensor) -> Tensor:
        """x: (M, N, d) -> (M, N, d)."""
        hidden = self.activation(grouped_linear(x, self.mlp_in_weight, self.mlp_in_bias))  # (M, N, F)
        if self.mlp_gate_weight is not None:
            hidden = hidden * grouped_linear(x, self.mlp_gate_weight, self.mlp_gate_bias)
        return grouped_linear(hidden, self.mlp_out_weight, self.mlp_out_bias)

    def norm(self, x: Tensor, which: int) -> Tensor:
        weight, bias = getattr(self, f"norm{which}_weight"), getattr(self, f"norm{which}_bias")
        return x if weight is None else grouped_layer_norm(x, weight, bias, self.eps[which - 1])

    def write_member(self, m: int, block: Block) -> None:
        """Member m's slice of this layer into its HF layer `block` (the inverse of `from_blocks`); a tensor with
        one copy (G = 1) is the members' shared one."""
        self.member_attention(m).write_block(block)
        for tensors in _block_groups(block).values():
            for name, target in tensors.items():  # views of the HF tensors
                target.copy_(_own(getattr(self, name), m))


def _token_mask(mask: Tensor | None) -> Tensor | None:
    """Which tokens are real, (1|B, T, 1) bool, from a boolean attention mask (B, 1, 1|T, T) or (T, T): those some
    query may attend to (as HF's DeBERTa reads its ConvLayer's mask off a 4-D one); None (no mask): all."""
    if mask is None:
        return None
    if mask.is_floating_point():
        raise ValueError("a layer with an input convolution reads its padding off a boolean mask; got a score bias.")
    keys = mask.any(-2)  # (B, 1, T) or (T,)
    return keys.reshape(keys.shape[0] if keys.dim() > 1 else 1, keys.shape[-1], 1)


def _split(mask: AttentionInputs) -> LayerAttention:
    """A layer's mask (or score bias), rotary table and position scoring, whichever way they were passed."""
    return mask if isinstance(mask, LayerAttention) else LayerAttention(mask)


def _with_scores(scores: Tensor, mask: Tensor | None, queries: int | None) -> Tensor:
    """A family's additive scores (R, H, T, T) as SDPA's float mask: the first `queries` rows, the lowest float
    where the boolean `mask` (broadcastable) forbids (as HF's masked_fill), (R, H, q, T)."""
    scores = scores if queries is None else scores[..., :queries, :]
    return scores if mask is None else scores.masked_fill(~mask, torch.finfo(scores.dtype).min)


def _rotate(x: Tensor, rotary: tuple[Tensor, Tensor], members: int = 1) -> Tensor:
    """Rotary position embedding of q or k, in float32 as HF's ModernBERT applies it (DINOv3 rotates in the input's
    dtype: the same in fp32, within rounding in bf16). x (R*b, H, t, dh) for R = `members`
    stacked streams of b = 1|B rows each; cos, sin (1|B, T, dh), of which the first t positions are used."""
    cos, sin = (table[:, : x.shape[-2]] for table in rotary)
    if cos.shape[0] > 1 and members > 1:  # per-row positions: one table per row of each member's stream
        cos, sin = cos.repeat(members, 1, 1), sin.repeat(members, 1, 1)
    cos, sin = cos[:, None], sin[:, None]  # (1|R*B, 1, t, dh)
    x32 = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


def layer_inputs(mask: AttentionInputs | Sequence[LayerAttention], layer: int) -> AttentionInputs:
    """What layer `layer` takes of what `HydraEnsemble.embed` returned: its own `LayerAttention` where the
    family gives one per layer, else the one mask (or score bias) all layers share."""
    return mask[layer] if isinstance(mask, (list, tuple)) and not isinstance(mask, LayerAttention) else mask


def batch_rows(mask: AttentionInputs | Sequence[LayerAttention], rows: slice, batch: int):
    """The rows `rows` of a mask, score bias, `LayerAttention` or per-layer list of them for a batch of `batch`
    rows (a tensor with one row, or none, is shared by all rows and kept whole)."""
    return _per_example(mask, batch, lambda tensor: tensor[rows])


def repeat_rows(mask: AttentionInputs | Sequence[LayerAttention], count: int, batch: int):
    """A mask, score bias, `LayerAttention` or per-layer list of them for `count` copies of a batch of `batch`
    rows stacked copy-major on the batch axis (count*batch rows); a tensor with one row, or none, stays shared."""
    return _per_example(mask, batch, lambda tensor: tensor.repeat(count, *[1] * (tensor.dim() - 1)))


def _per_example(mask: AttentionInputs | Sequence[LayerAttention], batch: int, fn: Callable[[Tensor], Tensor]):
    """`fn` applied to every per-example tensor (its first axis the `batch` rows: a mask, a score bias, a rotary
    table) of a mask, `LayerAttention` or per-layer list of them; the same structure back."""
    if isinstance(mask, Tensor):
        return fn(mask) if mask.dim() >= 3 and mask.shape[0] == batch else mask
    if isinstance(mask, LayerAttention):
        rotary = None if mask.rotary is None else tuple(_per_example(t, batch, fn) for t in mask.rotary)
        return mask._replace(mask=_per_example(mask.mask, batch, fn), rotary=rotary)
    if isinstance(mask, (list, tuple)):
        return [_per_example(entry, batch, fn) for entry in mask]
    return mask


def _first_queries(q: Tensor, mask: Tensor | None, queries: int | None) -> tuple[Tensor, Tensor | None]:
    """Only the first `queries` query rows (keys and values keep every token). q (..., T, dh) -> (..., q, dh)."""
    if queries is None:
        return q, mask
    if mask is not None and mask.shape[-2] > 1:  # a causal mask or a score bias has one row per query
        mask = mask[..., :queries, :]
    return q[..., :queries, :], mask


def _member_attention(
    tensors: Mapping[str, Tensor], head_counts: Sequence[int], head_dim: int, m: int, projections: int
) -> MemberAttention:
    """Member m's block (views) of attention tensors in either layout (a 2-D qkv_weight is ragged), whose
    qkv_weight holds `projections` per-head blocks."""
    qkv_weight, qkv_bias, o_weight, o_bias = (tensors.get(name) for name in ATTENTION)
    rows = head_counts[m] * head_dim
    own_bias = None if o_bias is None else _own(o_bias, m)  # (1, d)
    if qkv_weight.dim() == 2:  # ragged: member m's columns follow those of members 0..m-1
        start = sum(head_counts[:m]) * head_dim
        columns = slice(projections * start, projections * (start + rows))
        own_qkv_bias = None if qkv_bias is None else qkv_bias[None, columns]
        return MemberAttention(qkv_weight[:, columns], own_qkv_bias, o_weight[start : start + rows], own_bias)
    g = m if qkv_weight.shape[0] > 1 else 0  # padded: G = 1 when the members are identical
    width = qkv_weight.shape[2] // projections  # Hp*dh
    blocks = [slice(j * width, j * width + rows) for j in range(projections)]  # member m's q, k, v, ... slots
    return MemberAttention(
        torch.cat([qkv_weight[g, :, s] for s in blocks], dim=1),
        None if qkv_bias is None else torch.cat([qkv_bias[g, :, s] for s in blocks], dim=1),
        o_weight[g, :rows],
        own_bias,
    )


def _attention_tensors(members: Sequence[MemberAttention], ragged: bool, projections: int) -> dict[str, Tensor]:
    """The layer's attention tensors in one layout from the members' blocks (see `FusedLayer`); no bias tensor
    where the members have none."""
    if ragged:
        tensors = {
            "qkv_weight": torch.cat([member.qkv_weight for member in members], dim=1),  # (d, n*H_tot*dh)
            "o_weight": torch.cat([member.o_weight for member in members]),  # (H_tot*dh, d)
        }
        if members[0].qkv_bias is not None:
            tensors["qkv_bias"] = torch.cat([member.qkv_bias[0] for member in members])  # (n*H_tot*dh,)
    else:
        tensors = _padded_attention(members, projections)
    if members[0].o_bias is not None:
        tensors["o_bias"] = torch.stack([member.o_bias for member in members])  # (M, 1, d)
    return tensors


def _padded_attention(members: Sequence[MemberAttention], projections: int) -> dict[str, Tensor]:
    """q/k/v (and further per-head blocks) and W_o of the padded layout: member m's H_m heads in its first slots,
    the slots past H_m zero."""
    first = members[0].qkv_weight
    d, width = first.shape[0], max(member.o_weight.shape[0] for member in members)  # width = Hp*dh
    qkv_weight = first.new_zeros(len(members), d, projections * width)
    qkv_bias = first.new_zeros(len(members), 1, projections * width)
    o_weight = first.new_zeros(len(members), width, d)
    for m, member in enumerate(members):
        rows = member.o_weight.shape[0]
        for j in range(projections):
            qkv_weight[m, :, j * width : j * width + rows] = member.qkv_weight[:, j * rows : (j + 1) * rows]
            if member.qkv_bias is not None:
                qkv_bias[m, :, j * width : j * width + rows] = member.qkv_bias[:, j * rows : (j + 1) * rows]
        o_weight[m, :rows] = member.o_weight
    tensors = {"qkv_weight": qkv_weight, "o_weight": o_weight}
    return tensors if members[0].qkv_bias is None else tensors | {"qkv_bias": qkv_bias}


def _shared_or_stacked(blocks: Sequence[Block], mlp: MLPMode) -> tuple[dict[str, Tensor], list[str]]:
    """Norm, MLP and layer-scale tensors: one copy when all members hold the same values (exact), otherwise the
    members' average (mlp="average", the paper's merged MLP) or all of them stacked (mlp="stack", exact).
    Also returns the names of the tensors averaged although the members differ in them (the approximation)."""
    per_block = [_block_groups(block) for block in blocks]
    out: dict[str, Tensor] = {}
    averaged: list[str] = []
    for key, first in per_block[0].items():
        group = {name: [groups[key][name] for groups in per_block] for name in first}
        shapes = {name: {tuple(t.shape) for t in ts} for name, ts in group.items()}
        uneven = {name: sorted(s) for name, s in shapes.items() if len(s) > 1}
        if uneven:
            raise ValueError(
                f"members differ in the shape of {uneven}; fusion needs equal MLP widths: prune the MLP neurons of the "
                "base model once (hydra-ens amp / adaptive MLP pruning) and build every member from it, rather than "
                "pruning each member's MLP apart."
            )
        combined, approximate = share_average_or_stack(group, mlp)
        out |= combined
        averaged += list(group) if approximate else []
    return out, averaged


def _block_groups(block: Block) -> dict[str, dict[str, Tensor]]:
    """One HF layer's norm, MLP, layer-scale and input-convolution tensors, by the group (`SHAREABLE`) and name
    they have here, as views of the HF tensors laid out as here: weights (d, F), (F, d), biases (1, F), (1, d),
    norms (d,), convolution (d, d/g, k). An absent bias, an Identity in place of a norm and a missing gate, scale
    or convolution are left out."""
    groups = {}
    for which, norm in ((1, block.norm1), (2, block.norm2)):
        if not isinstance(norm, nn.Identity):
            groups[f"norm{which}"] = {f"norm{which}_weight": norm.weight, f"norm{which}_bias": norm.bias}
    width = block.mlp_out.in_features  # F
    mlp_in = block.mlp_in.weight.T  # (d, F), or (d, 2F) with columns [input | gate] when gated
    mlp_in_bias = None if block.mlp_in.bias is None else block.mlp_in.bias[None]  # (1, F|2F)
    mlp_out_bias = None if block.mlp_out.bias is None else block.mlp_out.bias[None]  # (1, d)
    groups["mlp"] = {
        "mlp_in_weight": mlp_in[:, :width],  # (d, F)
        "mlp_in_bias": None if mlp_in_bias is None else mlp_in_bias[:, :width],  # (1, F)
        "mlp_out_weight": block.mlp_out.weight.T,  # (F, d)
        "mlp_out_bias": mlp_out_bias,
    }
    if block.gated_mlp:
        gate_bias = None if mlp_in_bias is None else mlp_in_bias[:, width:]  # (1, F)
        groups["mlp"] |= {"mlp_gate_weight": mlp_in[:, width:], "mlp_gate_bias": gate_bias}
    if block.scale1 is not None:
        groups["scale1"] = {"scale1": block.scale1}
        groups["scale2"] = {"scale2": block.scale2}
    if block.input_conv is not None:
        conv, norm = block.input_conv.conv, block.input_conv.norm
        groups["conv"] = {
            "conv_weight": conv.weight,  # (d, d/g, k)
            "conv_bias": conv.bias,  # (d,)
            "conv_norm_weight": norm.weight,
            "conv_norm_bias": norm.bias,
        }
    return {key: {name: t for name, t in group.items() if t is not None} for key, group in groups.items()}


def _bias_rows(linear: nn.Linear, own: slice, rows: int | None, like: Tensor) -> Tensor:
    """The first `rows` (None: all) of a Linear's bias within its rows `own` (a view), or zeros where it has none."""
    if linear.bias is not None:
        return linear.bias[own][:rows]
    return like.new_zeros(linear.weight[own][:rows].shape[0])


def _own(tensor: Tensor, m: int) -> Tensor:
    """Member m's copy of a tensor with a group axis G first (G = 1: the members' shared copy)."""
    return tensor[m] if tensor.shape[0] > 1 else tensor[0]


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
