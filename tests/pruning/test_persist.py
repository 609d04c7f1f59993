"""One persistence path: every structural change is recorded in config.json and replayed on load, so a model
changed in two ways (heads, and a second structure such as kept MLP neurons) saves and reloads as a plain HF
model with identical outputs."""

import torch
from conftest import MODELS, make_inputs, output
from transformers.pytorch_utils import prune_linear_layer

import hydra_ensembles as he
from hydra_ensembles.pruning import persist

NEURONS_KEY = "test_kept_neurons"  # a miniature of the kept-MLP-neurons map of adaptive MLP pruning


def keep_neurons(model, kept):
    """Keep only MLP neurons `kept[layer]` (rows of the MLP's first linear, columns of its second)."""
    for layer, neurons in kept.items():
        block = model.bert.encoder.layer[int(layer)]
        index = torch.tensor(neurons)
        block.intermediate.dense = prune_linear_layer(block.intermediate.dense, index, dim=0)
        block.output.dense = prune_linear_layer(block.output.dense, index, dim=1)
    model.config.test_kept_neurons = {str(layer): list(neurons) for layer, neurons in kept.items()}
    return model


def test_a_model_changed_two_ways_reloads_as_saved(tmp_path, monkeypatch):
    monkeypatch.setitem(persist.STRUCTURES, NEURONS_KEY, keep_neurons)
    model = MODELS["bert"]()
    he.prune_heads(model, {0: [1, 2], 2: [0]})
    keep_neurons(model, {1: [0, 3, 5, 30]})
    he.save_model(model, tmp_path / "m")
    loaded = he.load_model(tmp_path / "m")
    assert type(loaded) is type(model) and he.kept_heads(loaded) == he.kept_heads(model)
    assert loaded.bert.encoder.layer[1].intermediate.dense.out_features == 4
    inputs = make_inputs("bert")
    assert torch.equal(output(loaded, inputs), output(model, inputs))  # same weights, same shapes: bit-identical
    fused_config = he.HydraEnsemble.fuse([loaded]).model_config
    assert getattr(fused_config, NEURONS_KEY) is None and getattr(fused_config, he.pruning.KEPT_HEADS_KEY) is None
