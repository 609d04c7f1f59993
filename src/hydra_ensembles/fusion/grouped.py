"""Grouped primitives: one op applies M members' weights to M member streams, with no loop over members.

Layout (STYLE.md habit 8): member streams are stacked member-major, x has shape (M, N, d) where N = B*T rows.
A weight with a leading group axis G = M holds one matrix per member; G = 1 means the members share it, and the
op then runs as a single large matmul over all M*N rows. Per-member weights run as M plain matmuls into one output
(on a CPU, MKL runs them faster than its batched GEMM; on a GPU each fuses its bias into the GEMM, which a batched
GEMM cannot), or, on a GPU with few rows, where kernel launches cost more than the copy of the bias, as one batched
matmul.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

# On a GPU, per-member weights with fewer rows a member than this run as one batched matmul (see the module docstring)
BATCHED_BELOW_ROWS = 1024


def grouped_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """y[m] = x[m] @ weight[g(m)] + bias[g(m)] (no bias term where `bias` is None).

    Shapes: x (M, N, d_in); weight (G, d_in, d_out); bias (G, 1, d_out); returns (M, N, d_out); G in {1, M}.
    Note the weight is stored transposed relative to `nn.Linear` (d_in first) so `baddbmm` reads it directly.
    """
    members, rows, d_in = x.shape
    if weight.shape[0] == 1:  # shared: one matmul over all member rows
        return _affine(x.reshape(members * rows, d_in), weight[0], bias, 0).view(members, rows, -1)
    if weight.shape[0] != members:  # one stream against M members' weights would compute member 0 alone
        raise ValueError(f"grouped_linear: {members} member stream(s) for {weight.shape[0]} members' weights.")
    few_rows = x.device.type != "cpu" and rows < BATCHED_BELOW_ROWS
    if few_rows or not _may_write_out(x, weight, bias):  # one batched kernel
        return torch.bmm(x, weight) if bias is None else torch.baddbmm(bias, x, weight)
    # M plain GEMMs into one output. On a CPU MKL's batched GEMM ran 15-30% slower (benchmarks/inference.py); on a
    # GPU baddbmm first copies the broadcast bias into its whole output, where each addmm adds it in its epilogue
    out = x.new_empty(members, rows, weight.shape[2])
    for m in range(members):
        _affine(x[m], weight[m], bias, m, out=out[m])
    return out


def _affine(x: Tensor, weight: Tensor, bias: Tensor | None, m: int, out: Tensor | None = None) -> Tensor:
    """x @ weight + bias[m], written to `out` when given. x (N, d_in), weight (d_in, d_out), bias (G, 1, d_out)."""
    if bias is None:
        return torch.mm(x, weight, out=out)
    # a 1-D bias, as nn.Linear passes it: on a GPU cuBLASLt adds it in the GEMM's epilogue; a (1, d_out) one is
    # first copied into the whole output (on a CPU both are)
    return torch.addmm(bias[m, 0], x, weight, out=out)


def _may_write_out(x: Tensor, *tensors: Tensor | None) -> bool:
    """Whether ops may write into a preallocated output: not while autograd records (it follows only
    out-of-place ops), nor under autocast (which skips out= ops)."""
    tracking = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, *tensors))
    return not tracking and not torch.is_autocast_enabled(x.device.type)


def grouped_layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    """LayerNorm over the last axis with per-member (G = M) or shared (G = 1) affine parameters (no bias where
    `bias` is None).

    Shapes: x (M, N, d); weight, bias (G, d); returns (M, N, d).
    """
    if weight.shape[0] == 1:
        return F.layer_norm(x, x.shape[-1:], weight[0], None if bias is None else bias[0], eps)
    normed = F.layer_norm(x, x.shape[-1:], eps=eps)
    if bias is None:
        return normed * weight[:, None, :]
    return torch.addcmul(bias[:, None, :], normed, weight[:, None, :])


def group_scale(x: Tensor, scale: Tensor | None) -> Tensor:
    """x[m] * scale[g(m)] for layer scale; identity when `scale` is None. x (M, N, d), scale (G, d)."""
    return x if scale is None else x * scale[:, None, :]


def ragged_linear(x: Tensor, weight: Tensor, bias: Tensor | None, widths: Sequence[int]) -> Tensor:
    """y[m] = x[:, cols_m] @ weight[cols_m] + bias[m]: member m's block of features through its block of rows
    (no bias term where `bias` is None).

    Shapes: x (N, W), weight (W, d_out), bias (M, 1, d_out), returns (M, N, d_out); `widths` (M,) sum to W and
    cols_m are member m's, after those of members 0..m-1 (a width of 0 gives the bias alone). The ragged
    attention's output projection: members keep different numbers of heads.
    """
    starts = [sum(widths[:m]) for m in range(len(widths))]
    blocks = [(x[:, s : s + w], weight[s : s + w]) for s, w in zip(starts, widths)]
    if not _may_write_out(x, weight, bias):
        return torch.stack([_affine(a, w, bias, m) for m, (a, w) in enumerate(blocks)])
    out = x.new_empty(len(widths), x.shape[0], weight.shape[1])
    for m, (a, w) in enumerate(blocks):  # M plain GEMMs into one output, as `grouped_linear` on CPU
        _affine(a, w, bias, m, out=out[m])
    return out


def grouped_conv1d(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """A 1-D convolution over the token axis, padding (k - 1) // 2 (T rows out for an odd kernel k), with
    per-member (G = M) or shared (G = 1) kernels of g groups (d / g input channels each).

    Shapes: x (S, B, T, d), S in {1, M} streams; weight (G, d, d/g, k); bias (G, d); returns (max(S, G), B, T, d).
    Per-member kernels run as one grouped convolution, the members' channels side by side (M*g groups).
    """
    streams, batch, tokens, d = x.shape
    members, kernel = weight.shape[0], weight.shape[-1]
    groups, padding = d // weight.shape[2], (kernel - 1) // 2
    if members == 1:  # shared: every stream's rows are more batch rows
        rows = x.reshape(streams * batch, tokens, d).transpose(1, 2)  # (S*B, d, T)
        out = F.conv1d(rows, weight[0], None if bias is None else bias[0], padding=padding, groups=groups)
        return out.transpose(1, 2).reshape(streams, batch, -1, d)
    channels = x.expand(members, *x.shape[1:]).permute(1, 0, 3, 2).reshape(batch, members * d, tokens)  # (B, M*d, T)
    flat_bias = None if bias is None else bias.flatten()  # (M*d,)
    out = F.conv1d(channels, weight.flatten(0, 1), flat_bias, padding=padding, groups=members * groups)  # (B, M*d, T)
    return out.view(batch, members, d, -1).permute(1, 0, 3, 2)  # (M, B, T, d)
