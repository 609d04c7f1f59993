"""Shared trunk: leading layers identical in every member run once, exactly."""

import pytest
import torch
from conftest import HEADS, LAYERS, at_trained_scale, fused_output, make_inputs, output, smallest_head_effect
from tolerances import CONTRACT, DEFECT

import hydra_ensembles as he


def _members(name: str, shared_layers: int):
    """3 members with the same heads and weights in layers < shared_layers, different ones after."""
    g = torch.Generator().manual_seed(0)
    common = {layer: sorted(torch.randperm(HEADS, generator=g)[:3].tolist()) for layer in range(shared_layers)}
    maps = [
        common
        | {
            layer: sorted(torch.randperm(HEADS, generator=g)[: 1 + m].tolist())
            for layer in range(shared_layers, LAYERS)
        }
        for m in range(3)
    ]
    # with every layer shared the head maps are equal; the classifiers, nudged below, still make them distinct
    members = he.build_members(at_trained_scale(name), maps, allow_identical=True)
    for m, member in enumerate(members):
        with torch.no_grad():
            for param_name, p in member.named_parameters():
                late = any(
                    f"layer.{i}." in param_name or f"layers.{i}." in param_name for i in range(shared_layers, LAYERS)
                )
                if late or "classifier" in param_name:
                    p.add_(0.01 * (m + 1))
    return members


@pytest.mark.parametrize("name", ["bert", "vit"])
@pytest.mark.parametrize("shared_layers", [0, 1, 2, 3])
def test_trunk_is_exact(name, shared_layers):
    inputs = make_inputs(name)
    members = _members(name, shared_layers)
    ensemble = he.HydraEnsemble.fuse(members, mlp="stack")
    assert ensemble.trunk == shared_layers
    expected = torch.stack([output(m, inputs) for m in members], dim=1)
    assert (fused_output(ensemble, inputs) - expected).abs().max().item() <= CONTRACT
    assert smallest_head_effect(members[-1], inputs) >= DEFECT  # a head misplaced in or past the trunk would show


def test_trunk_flops_fall_with_shared_layers():
    inputs = make_inputs("vit")
    flops = [he.count_flops(he.HydraEnsemble.fuse(_members("vit", k), mlp="stack"), inputs) for k in range(LAYERS + 1)]
    assert flops == sorted(flops, reverse=True) and flops[-1] < flops[0]
