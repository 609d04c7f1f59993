"""The model card (README.md beside the weights): written by every save, naming the method, its settings and its
cost; rewritten by `hydra-ens evaluate` with the metrics it measured; saved atomically with the weights."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from conftest import MODELS, random_head_maps

import hydra_ensembles as he
import hydra_ensembles.predictors.card as model_card
from hydra_ensembles.cli import main
from hydra_ensembles.predictors import load_predictor, save_predictor

WORDS = "match goal team vote party law market bank price recipe oven flour".split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="module")
def members() -> list[torch.nn.Module]:
    """3 pruned tiny BERT members; member 1 also lost MLP neurons in layer 0 (37 -> 30)."""
    members = he.build_members(MODELS["bert"](), random_head_maps(3, seed=4, min_heads=1))
    he.prune_neurons(members[1], {0: list(range(7))})
    return members


def card(path) -> str:
    return (path / "README.md").read_text()


def test_card_of_a_fused_ensemble_names_method_settings_and_cost(members, tmp_path):
    ensemble = he.HydraEnsemble.fuse([members[0], members[2]], mlp="stack")
    text = card(save_predictor(ensemble, tmp_path / "hydra"))
    assert "A Hydra Ensemble of 2 pruned BertForSequenceClassification members" in text
    assert "fusion mode: `mlp=stack`" in text
    totals = [sum(len(heads) for heads in head_map.values()) for head_map in ensemble.head_maps]
    assert f"| total | {totals[0]} | {totals[1]} |" in text  # heads kept per member, in all and per layer:
    assert f"| 1 | {ensemble.head_maps[0][1]} | {ensemble.head_maps[1][1]} |" in text
    ratio = he.count_parameters(ensemble) / he.count_parameters(MODELS["bert"]())
    assert f"| ratio | {ratio:.2f}x |" in text
    assert "Not evaluated yet" in text


def test_card_of_a_wrapper_costs_the_whole_predictor_not_its_first_member(members, tmp_path):
    """A deep ensemble's `base` is its first member; its card must count all three (3x one member's parameters)."""
    ensemble = he.predictors.DeepEnsemble(members)
    text = card(save_predictor(ensemble, tmp_path / "deep"))
    ratio = he.count_parameters(ensemble) / he.count_parameters(MODELS["bert"]())
    assert ratio > 2 and f"| ratio | {ratio:.2f}x |" in text
    # its title and head table were its first member's ("A pruned BertForSequenceClassification", one column)
    assert "# A deep ensemble of 3 BertForSequenceClassification models, run one after another" in text
    totals = [sum(len(heads) for heads in he.kept_heads(m).values()) for m in members]
    assert f"| total | {totals[0]} | {totals[1]} | {totals[2]} |" in text


def test_a_wrapper_writes_one_card_for_itself_and_none_inside(members, tmp_path):
    """Temperature scaling of MC dropout of a pruned model: one card, at the top, naming both wrappers (a card
    per nested save would count the inner model's FLOPs again and describe only a part)."""
    wrapped = he.predictors.Calibrated(
        he.predictors.MCDropout(members[0], samples=2), he.predictors.TemperatureScaling(1.5)
    )
    path = save_predictor(wrapped, tmp_path / "calibrated")
    assert sorted(p.name for p in path.rglob("README.md")) == ["README.md"] and (path / "README.md").is_file()
    assert "(calibrated + mc_dropout)" in card(path)


def test_card_of_a_pruned_model_lists_neurons_and_keeps_an_hf_folder(members, tmp_path):
    path = save_predictor(members[1], tmp_path / "member")
    assert sorted(p.name for p in path.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    text = card(path)
    assert "A pruned BertForSequenceClassification" in text
    assert "MLP neurons kept per layer (of 37): [30, 37, 37]" in text
    assert he.kept_heads(load_predictor(path)) == he.kept_heads(members[1])  # still loads as the model saved


def test_card_names_the_circuit_the_members_were_drawn_from(members, tmp_path):
    record = {"command": "members", "settings": {"source": {"path": "/runs/circuit/circuit.json"}, "budget": 4}}
    (tmp_path / "hydra-ens.json").write_text(json.dumps(record))
    text = card(save_predictor(members[0], tmp_path / "member0"))
    assert "head selection: circuit `/runs/circuit/circuit.json`" in text and "budget 4" in text


def test_a_failed_save_keeps_the_previous_save_and_its_card(members, tmp_path, monkeypatch):
    path = save_predictor(members[0], tmp_path / "member")
    before = {p.name: p.read_bytes() for p in path.iterdir()}

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(model_card, "card_text", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        save_predictor(members[2], path)
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["member"]  # no partial directory left beside it


def test_evaluate_writes_its_metrics_into_the_card_and_a_rerun_is_a_no_op(tmp_path, capsys):
    model_dir = tmp_path / "classifier"
    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    config = T.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        num_labels=2,
        id2label={0: "a", 1: "b"},
        label2id={"a": 0, "b": 1},
    )
    torch.manual_seed(0)
    save_predictor(he.prune_heads(T.BertForSequenceClassification(config).eval(), {0: [1]}), model_dir)
    T.BertTokenizer(vocab=vocab).save_pretrained(model_dir)
    rows = [f"{' '.join(WORDS[i % 6 + 6 * (i % 2) : i % 6 + 6 * (i % 2) + 4])},{'ab'[i % 2]}" for i in range(12)]
    (tmp_path / "test.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    command = [
        "evaluate",
        "--model",
        f"tiny={model_dir}",
        "--data",
        str(tmp_path / "test.csv"),
        "--out",
        str(tmp_path / "report"),
        "--latency-repeats",
        "0",
        "--device",
        "cpu",
        "--quiet",
    ]
    assert main(command) == 0
    measured = json.loads((tmp_path / "report" / "metrics.json").read_text())["results"]["tiny"]["metrics"]["id"]
    text = card(model_dir)
    assert "The last `hydra-ens evaluate` run" in text and "Not evaluated yet" not in text
    assert f"| id | acc | {measured['acc']:.4g} |" in text and f"| id | nll | {measured['nll']:.4g} |" in text
    capsys.readouterr()
    assert main(command) == 0  # the card changed, but it is no input: the finished step is not redone
    assert "already done" in capsys.readouterr().out


def test_a_baseline_that_is_its_own_method_says_so_in_its_title():
    """Packed-Ensembles are no pruned Hydra members, MIMO no plain ViT: each of these kinds names its method."""
    vit, bert = MODELS["vit"](), MODELS["bert"]()
    titles = [
        (
            "Packed-Ensembles (Laurent et al., 2023): 3 narrow ViTForImageClassification",
            he.predictors.packed_ensemble(vit),
        ),
        ("MIMO (Havasi et al., 2020): one ViTForImageClassification that reads 3 inputs", he.predictors.mimo(vit)),
        (
            "BatchEnsemble (Wen et al., 2020): 2 members of one BertForSequenceClassification",
            he.predictors.batch_ensemble(bert, members=2),
        ),
    ]
    calibrated = he.predictors.Calibrated(titles[0][1], he.predictors.TemperatureScaling(1.5))  # titled under it
    titles.append((titles[0][0], calibrated))
    for title, predictor in titles:
        text = model_card.card_text(predictor)
        assert f"# {title}" in text and "Hydra Ensemble" not in text.split("\n## ")[0]
    assert "fused (calibrated)\n" in model_card.card_text(calibrated)


def test_a_packed_ensemble_card_compares_with_the_full_width_model_and_names_no_heads(tmp_path):
    """Its members are narrow networks trained from scratch: measured against one narrow member, the card called
    the base "hidden size 24" and listed pruned heads."""
    vit = MODELS["vit"]()
    packed = he.predictors.packed_ensemble(vit)
    he.predictors.save_predictor(packed, tmp_path / "p")
    for predictor in (packed, he.predictors.load_predictor(tmp_path / "p")):
        text = model_card.card_text(predictor)
        assert f"hidden size {vit.config.hidden_size}" in text and "Heads kept per layer" not in text
        assert "3 narrow networks (alpha=2, gamma=1" in text
        ratio = he.count_parameters(packed) / he.count_parameters(vit)
        assert f"{ratio:.2f}x" in text, text


@pytest.mark.parametrize("name, width", [("distilbert", 37), ("dinov2", 64), ("clip_classifier", 37)])
def test_card_reads_sizes_from_the_model_whatever_its_config_calls_them(name, width):
    """DistilBERT's hidden_dim, DINOv2's mlp_ratio, CLIP's vision_config: an unpruned model is not called pruned."""
    model = MODELS[name]()
    text = model_card.card_text(model)
    assert f"# A {type(model).__name__}" in text and "pruned" not in text.split("\n## ")[0]
    assert f"MLP width {width}" in text and f"MLP neurons kept: all ({width} per layer)." in text
    he.prune_neurons(model, {0: [0]})
    text = model_card.card_text(model)
    assert f"# A pruned {type(model).__name__}" in text and f"MLP neurons kept per layer (of {width})" in text
