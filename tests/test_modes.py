"""Inference that switches a model to eval mode gives every submodule its own mode back (`modes.evaluating`)."""

import pytest
import torch
from conftest import MODELS, make_inputs

from hydra_ensembles.modes import evaluating
from hydra_ensembles.outputs import collect_member_logits


def wrapper_holding_a_member_in_eval() -> torch.nn.Module:
    """A wrapper in training mode around a member held in eval mode, as a predictor may hold a frozen part."""
    wrapper = torch.nn.ModuleDict({"member": MODELS["bert"]()}).train()
    wrapper["member"].eval()
    wrapper.forward = lambda **inputs: wrapper["member"](**inputs)
    return wrapper


def modes(module: torch.nn.Module) -> dict[str, bool]:
    return {name: sub.training for name, sub in module.named_modules()}


def test_evaluating_gives_each_submodule_its_mode_back_even_after_an_error():
    wrapper = wrapper_holding_a_member_in_eval()
    before = modes(wrapper)
    with pytest.raises(RuntimeError, match="stopped"), evaluating(wrapper) as held:
        assert held is wrapper and not any(modes(wrapper).values())
        raise RuntimeError("stopped")
    assert modes(wrapper) == before and wrapper.training and not wrapper["member"].training


def test_predicting_leaves_a_member_held_in_eval_mode_in_eval_mode():
    """`model.train(was_training)` after inference switched on the dropout of every member the wrapper held in
    eval mode."""
    wrapper = wrapper_holding_a_member_in_eval()
    before = modes(wrapper)
    inputs = make_inputs("bert")
    logits = collect_member_logits(wrapper, [dict(inputs, labels=torch.zeros(4, dtype=torch.long))])
    assert logits.shape[:2] == (4, 1)
    assert modes(wrapper) == before
