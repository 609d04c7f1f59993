"""Negative log-likelihood of a regressor's predictive Gaussian mixture."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def gaussian_mixture_nll(member_gaussians: Tensor, targets: Tensor) -> float:
    """Mean negative log-density of the targets under the uniform mixture of the members' Gaussians; lower is
    better: NLL = -(1/N) sum_i log[(1/M) sum_m N(y_i; mu_im, sigma_im^2)], in nats (M = 1: one Gaussian).

    Computed in float64 with a log-sum-exp over members. Shape: member_gaussians (N, M, 2), (mean, log-variance)
    per member; targets (N,).
    """
    if (
        member_gaussians.ndim != 3
        or member_gaussians.shape[-1] != 2
        or tuple(targets.shape) != (member_gaussians.shape[0],)
    ):
        raise ValueError(
            "gaussian_mixture_nll needs member_gaussians (N, M, 2) of (mean, log-variance) and targets (N,), got "
            f"{tuple(member_gaussians.shape)} and {tuple(targets.shape)}."
        )
    if not len(targets) or not member_gaussians.shape[1]:
        raise ValueError("gaussian_mixture_nll needs N > 0 targets and M > 0 members.")
    bad = int(torch.isnan(member_gaussians).flatten(1).any(dim=1).sum() + torch.isnan(targets).sum())
    if bad:
        raise ValueError(f"gaussian_mixture_nll: {bad} NaN prediction row(s) or target(s); fix them before measuring.")
    return _compute(member_gaussians.double(), targets.to(member_gaussians.device).double()).item()


def _compute(member_gaussians: Tensor, targets: Tensor) -> Tensor:
    mu, log_var = member_gaussians[..., 0], member_gaussians[..., 1]  # (N, M)
    log_density = -0.5 * (math.log(2 * math.pi) + log_var + (targets[:, None] - mu) ** 2 / log_var.exp())
    members = member_gaussians.shape[1]
    return -(torch.logsumexp(log_density, dim=1) - math.log(members)).mean()
