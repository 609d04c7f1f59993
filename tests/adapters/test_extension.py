"""Adding a family is adding one adapter: ERNIE (BERT's layers, plus a task-type embedding input) registered in a
test."""

import copy

import pytest
import torch
import transformers as T
from conftest import (
    fused_output,
    make_inputs,
    output,
    perturb,
    random_head_maps,
    scaled_as_trained,
    smallest_head_effect,
)
from tolerances import CONTRACT, DEFECT

import hydra_ensembles as he
from hydra_ensembles.adapters import ModelSpec
from hydra_ensembles.adapters.bert import BertAdapter


class ErnieAdapter(BertAdapter):
    name = "ernie_test"
    input_names = (*BertAdapter.input_names, "task_type_ids")
    specs = {
        "ErnieForSequenceClassification": ModelSpec(
            backbone="ernie",
            head=lambda model, hidden, inputs: model.classifier(model.dropout(model.ernie.pooler(hidden))),
            classifier=True,
            head_tokens=1,
        )
    }

    def embed(self, backbone, inputs):
        return backbone.embeddings(
            input_ids=inputs["input_ids"],
            token_type_ids=inputs.get("token_type_ids"),
            task_type_ids=inputs.get("task_type_ids"),
        )  # (B, T, d)


@pytest.fixture
def ernie(monkeypatch):
    """ERNIE registered for the test alone (the registry is given back after it)."""
    from hydra_ensembles import adapters

    for registry in ("_BY_NAME", "_BY_CLASS"):
        monkeypatch.setattr(adapters, registry, dict(getattr(adapters, registry)))
    with pytest.raises(he.UnsupportedModelError):
        he.get_adapter(_model())
    he.register_adapter(ErnieAdapter())
    return scaled_as_trained(_model(), 5.0)  # at HF's init a head left in moves it only 4.5-6x the tolerance


def test_an_adapter_cannot_take_a_registered_name_or_class_unless_told(ernie):
    """Registering another adapter as "bert" replaced the built-in one for the whole process, silently."""
    from hydra_ensembles import adapters

    class Mine(BertAdapter):
        specs = {"MyModel": BertAdapter.specs["BertModel"]}

    with pytest.raises(ValueError, match="name 'bert' already belong.s. to a registered adapter.*replace=True"):
        he.register_adapter(Mine())
    taking = type("Taking", (ErnieAdapter,), {"name": "other"})  # a new name, ERNIE's class: refused too
    with pytest.raises(ValueError, match="ErnieForSequenceClassification already belong"):
        he.register_adapter(taking())
    he.register_adapter(ErnieAdapter())  # the same adapter again (a test run twice, a module imported again)
    he.register_adapter(taking(), replace=True)
    assert adapters.adapter_for_class(type(ernie)).name == "other"


def _model():
    torch.manual_seed(0)
    config = T.ErnieConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=37,
        num_labels=3,
        max_position_embeddings=24,
        use_task_id=True,
        task_type_vocab_size=3,
    )
    return T.ErnieForSequenceClassification(config).eval()


def test_a_registered_adapter_gets_pruning_and_fusion(ernie):
    inputs = make_inputs("bert") | {
        "task_type_ids": torch.randint(0, 3, (4, 10), generator=torch.Generator().manual_seed(0))
    }
    assert "ErnieForSequenceClassification" in he.supported_models()
    assert (fused_output(he.HydraEnsemble.fuse([ernie]), inputs)[:, 0] - output(ernie, inputs)).abs().max() <= CONTRACT
    plan = {0: [1], 1: [0, 1, 2, 3]}
    with he.ablate_heads(ernie, plan):
        ablated = output(ernie, inputs)
    pruned = he.prune_heads(copy.deepcopy(ernie), plan)
    assert (output(pruned, inputs) - ablated).abs().max() <= CONTRACT
    assert smallest_head_effect(pruned, inputs) >= DEFECT  # a head too many pruned would show
    for layer, heads in plan.items():  # and a head too few
        for head in heads:
            fewer = {other: [h for h in hs if (other, h) != (layer, head)] for other, hs in plan.items()}
            with he.ablate_heads(ernie, fewer):
                assert (output(ernie, inputs) - ablated).abs().max() >= DEFECT
    members = [perturb(m, seed=i) for i, m in enumerate(he.build_members(ernie, random_head_maps(3, seed=1)))]
    expected = torch.stack([output(m, inputs) for m in members], dim=1)
    assert (fused_output(he.HydraEnsemble.fuse(members, mlp="stack"), inputs) - expected).abs().max() <= CONTRACT
