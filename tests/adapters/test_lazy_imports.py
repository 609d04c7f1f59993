"""Importing hydra-ensembles or its CLI loads no HF modeling code: adapters match models by class name, and the
two that need HF functions or classes (DeBERTa-v2's relative positions, MPNet's attention) import them when a
model uses them, as export does `PreTrainedModel`, the classifier check HF's auto mappings, and plots matplotlib."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["hydra_ensembles", "hydra_ensembles.cli"])
def test_import_loads_no_hf_modeling_module_nor_matplotlib(module):
    """What `hydra-ens --help` pays: torch and transformers' top level, ~2.8 s of CPU here; HF's modeling code and
    matplotlib (~3 s more) load when a command uses them."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys, {module}; print(sorted(m for m in sys.modules if m in ('transformers.modeling_utils', "
            "'matplotlib') or (m.startswith('transformers.models.') and '.modeling_' in m)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert loaded == "[]", f"`import {module}` loaded {loaded}"


def test_pruned_mpnet_pickles():
    """The pruned attention class, made on first use, is still found by name: a pruned model pickles (torch.save of
    the whole module) and reloads with the same outputs."""
    import pickle

    import torch
    import transformers

    from hydra_ensembles import prune_heads

    config = transformers.MPNetConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, vocab_size=50
    )
    model = transformers.MPNetModel(config).eval()
    prune_heads(model, {0: [1, 2]})
    reloaded = pickle.loads(pickle.dumps(model))
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, reloaded(ids).last_hidden_state)
