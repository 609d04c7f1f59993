"""Adding a family is adding one adapter: ELECTRA (BERT-like layers, projected embeddings) registered in a test."""

import copy

import pytest
import torch
import transformers as T
from conftest import fused_output, make_inputs, output, perturb, random_head_maps
from tolerances import CONTRACT

import hydra_ensembles as he
from hydra_ensembles.adapters import ModelSpec
from hydra_ensembles.adapters.bert import BertAdapter


class ElectraAdapter(BertAdapter):
    name = "electra_test"
    embedding_paths = ("embeddings", "embeddings_project")
    specs = {
        "ElectraForSequenceClassification": ModelSpec(
            backbone="electra", head=lambda model, hidden, inputs: model.classifier(hidden), classifier=True
        )
    }

    def embed(self, backbone, inputs):
        hidden = super().embed(backbone, inputs)  # (B, T, embedding_size)
        return backbone.embeddings_project(hidden)  # (B, T, d)


@pytest.fixture
def electra():
    with pytest.raises(he.UnsupportedModelError):
        he.get_adapter(_model())
    he.register_adapter(ElectraAdapter())
    return _model()


def _model():
    torch.manual_seed(0)
    config = T.ElectraConfig(
        vocab_size=99,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=37,
        num_labels=3,
        max_position_embeddings=24,
    )
    return T.ElectraForSequenceClassification(config).eval()


def test_a_registered_adapter_gets_pruning_and_fusion(electra):
    inputs = make_inputs("bert")
    assert "ElectraForSequenceClassification" in he.supported_models()
    assert (
        fused_output(he.HydraEnsemble.fuse([electra]), inputs)[:, 0] - output(electra, inputs)
    ).abs().max() <= CONTRACT
    plan = {0: [1], 1: [0, 1, 2, 3]}
    with he.ablate_heads(electra, plan):
        ablated = output(electra, inputs)
    assert (output(he.prune_heads(copy.deepcopy(electra), plan), inputs) - ablated).abs().max() <= CONTRACT
    members = [perturb(m, seed=i) for i, m in enumerate(he.build_members(electra, random_head_maps(3, seed=1)))]
    expected = torch.stack([output(m, inputs) for m in members], dim=1)
    assert (fused_output(he.HydraEnsemble.fuse(members, mlp="stack"), inputs) - expected).abs().max() <= CONTRACT
