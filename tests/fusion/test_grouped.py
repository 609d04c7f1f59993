"""Grouped primitives equal the per-member loop they replace."""

import torch
import torch.nn.functional as F

from hydra_ensembles.fusion.grouped import grouped_layer_norm, grouped_linear, ragged_linear


def test_grouped_linear_per_member_and_shared():
    """Both ways per-member weights run (M GEMMs into one output; one batched GEMM, which autograd takes and a GPU
    takes for few rows), with and without a bias, equal nn.Linear member by member."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 5, generator=g)
    weight, bias = torch.randn(3, 5, 4, generator=g), torch.randn(3, 1, 4, generator=g)
    for b in (bias, None):
        own = [None if b is None else b[m, 0] for m in range(3)]
        loop = torch.stack([F.linear(x[m], weight[m].T, own[m]) for m in range(3)])
        torch.testing.assert_close(grouped_linear(x, weight, b), loop)
        torch.testing.assert_close(grouped_linear(x, weight.clone().requires_grad_(), b).detach(), loop)
        shared = torch.stack([F.linear(x[m], weight[0].T, own[0]) for m in range(3)])
        torch.testing.assert_close(grouped_linear(x, weight[:1], None if b is None else b[:1]), shared)


def test_grouped_layer_norm_per_member_and_shared():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 8, generator=g)
    weight, bias = torch.randn(2, 8, generator=g), torch.randn(2, 8, generator=g)
    loop = torch.stack([F.layer_norm(x[m], (8,), weight[m], bias[m], 1e-6) for m in range(2)])
    torch.testing.assert_close(grouped_layer_norm(x, weight, bias, 1e-6), loop)
    torch.testing.assert_close(
        grouped_layer_norm(x, weight[:1], bias[:1], 1e-6), F.layer_norm(x, (8,), weight[0], bias[0], 1e-6)
    )


def test_grouped_linear_is_differentiable():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, generator=g, requires_grad=True)
    weight, bias = torch.randn(2, 4, 5, generator=g), torch.randn(2, 1, 5, generator=g)
    grouped_linear(x, weight, bias).sum().backward()
    torch.testing.assert_close(x.grad, weight.sum(-1)[:, None, :].expand(2, 3, 4))


def test_ragged_linear_runs_each_members_block_of_features_through_its_block_of_rows():
    """Members of widths 3, 0 (no head left: the bias alone) and 2; the same with and without autograd."""
    g = torch.Generator().manual_seed(0)
    widths = [3, 0, 2]
    x, weight, bias = torch.randn(7, 5, generator=g), torch.randn(5, 4, generator=g), torch.randn(3, 1, 4, generator=g)
    expected = torch.stack(
        [x[:, :3] @ weight[:3] + bias[0], bias[1].expand(7, 4), x[:, 3:] @ weight[3:] + bias[2]]
    )  # (M, N, d_out)
    torch.testing.assert_close(ragged_linear(x, weight, bias, widths), expected)
    tracked = ragged_linear(x, weight.requires_grad_(), bias, widths)
    tracked.sum().backward()
    torch.testing.assert_close(tracked, expected)
    torch.testing.assert_close(weight.grad, torch.cat([x[:, :3].sum(0), x[:, 3:].sum(0)])[:, None].expand(5, 4))
