"""Structural pruning: contract 2 (pruned == ablated original), the head map, save/load, bad input."""

import copy
import json
import warnings

import numpy as np
import pytest
import safetensors.torch
import torch
import transformers as T
from conftest import (
    CONTRACT_MODELS,
    DINOV2,
    HEADS,
    IMAGE,
    LAYERS,
    MODELS,
    MORE_CLASSES,
    SIZES,
    TRAINED_SCALE,
    VOCAB,
    at_trained_scale,
    make_inputs,
    output,
    perturb,
    scaled_as_trained,
    smallest_head_effect,
)
from tolerances import CONTRACT, DEFECT

import hydra_ensembles as he

PLAN = {0: [1, 3], 1: [0, 1, 2, 3], 2: [2]}  # two heads, a whole layer, one head


@pytest.mark.parametrize("name", [*CONTRACT_MODELS, *MORE_CLASSES])
def test_pruned_model_equals_ablated_original(name):
    """Contract 2, with padded inputs, a layer emptied entirely and a layer left with one head."""
    model, inputs = at_trained_scale(name), make_inputs(name)
    plan = {0: [0, 1, 3], 1: [0, 1, 2, 3], 2: [2]}
    with he.ablate_heads(model, plan):
        ablated = output(model, inputs)
    pruned = he.prune_heads(copy.deepcopy(model), plan)
    assert (output(pruned, inputs) - ablated).abs().max().item() <= CONTRACT  # contract 2 (tests/tolerances.py)
    assert smallest_head_effect(pruned, inputs) >= DEFECT  # one head too many pruned would show
    assert _smallest_unpruning_effect(model, plan, inputs, ablated) >= DEFECT  # one head too few pruned would show


@pytest.mark.parametrize("family", ["bert", "vit"])
def test_the_head_size_is_the_one_the_familys_attention_uses(family):
    """A `head_dim` in a BERT config is ignored by BERT (hidden // heads = 8 here) but read by ViT: the adapter took
    it for every family, so ablating a BERT head zeroed 2 of its 8 columns and pruning crashed."""
    torch.manual_seed(0)
    if family == "bert":
        model = T.BertForSequenceClassification(
            T.BertConfig(vocab_size=VOCAB, max_position_embeddings=24, **SIZES, head_dim=2)
        )
    else:
        model = T.ViTForImageClassification(T.ViTConfig(**IMAGE, **SIZES, head_dim=2, num_labels=5))
    assert he.get_adapter(model).head_dim(model) == (8 if family == "bert" else 2)
    model = scaled_as_trained(model.eval(), TRAINED_SCALE[family])  # at HF's init a head too few moves it < 1e-5
    inputs, plan = make_inputs(family), {0: [1], 2: [0, 3]}
    with he.ablate_heads(model, plan):
        ablated = output(model, inputs)
    pruned = he.prune_heads(copy.deepcopy(model), plan)
    assert (output(pruned, inputs) - ablated).abs().max().item() <= CONTRACT
    assert smallest_head_effect(pruned, inputs) >= DEFECT  # one head too many pruned would show
    assert _smallest_unpruning_effect(model, plan, inputs, ablated) >= DEFECT  # one head too few pruned would show


def _smallest_unpruning_effect(model, plan, inputs, ablated) -> float:
    """min over the plan's heads of max |output change| when that head is left on and the rest ablated."""
    effects = []
    for layer, heads in plan.items():
        for head in heads:
            fewer = {other: [h for h in hs if (other, h) != (layer, head)] for other, hs in plan.items()}
            with he.ablate_heads(model, fewer):
                effects.append((output(model, inputs) - ablated).abs().max().item())
    return min(effects)


def test_head_map_follows_pruning_in_original_numbering():
    model = he.prune_heads(MODELS["bert"](), {0: [1]})
    he.prune_heads(model, {0: [3], 2: [0]})  # original numbering, also after earlier pruning
    assert he.kept_heads(model) == {0: [0, 2], 1: [0, 1, 2, 3], 2: [1, 2, 3]}
    attention = model.bert.encoder.layer[0].attention.self
    assert attention.num_attention_heads == 2 and attention.all_head_size == 16
    assert attention.query.weight.shape == (16, 32) and model.bert.encoder.layer[
        0
    ].attention.output.dense.weight.shape == (32, 16)


def test_sequential_pruning_equals_one_shot_pruning():
    inputs = make_inputs("bert")
    once = he.prune_heads(MODELS["bert"](), {0: [1, 3], 2: [0]})
    # head 3 after head 1: its index is then 2, so a second call read in current numbering would prune another
    twice = he.prune_heads(he.prune_heads(MODELS["bert"](), {0: [1]}), {0: [3], 2: [0]})
    assert torch.equal(output(once, inputs), output(twice, inputs))
    assert he.kept_heads(twice)[0] == [0, 2]


def test_emptied_layer_adds_only_the_output_bias():
    """Documented semantics of pruning every head of a layer: attention output == W_o bias, exactly."""
    model = at_trained_scale("vit")  # its biases drawn: HF's init zeroes them
    bias = model.vit.layers[1].attention.o_proj.bias.detach().clone()
    assert bias.abs().min() > 0
    he.prune_heads(model, {1: list(range(HEADS))})
    layer = model.vit.layers[1]
    assert he.kept_heads(model)[1] == []
    x = torch.randn(2, 17, 32)
    attention_out, _ = layer.attention(x)
    assert torch.equal(attention_out, bias.expand_as(attention_out))
    assert not layer.attention.q_proj.weight.requires_grad  # the placeholder stays zero under fine-tuning
    assert layer.attention.o_proj.bias.requires_grad


def test_ablation_restores_weights_exactly():
    model = MODELS["clip_text"]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with he.ablate_heads(model, PLAN):
        assert model.text_model.encoder.layers[1].self_attn.out_proj.weight.abs().sum() == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_pruning_keeps_each_tensors_trainability():
    model = MODELS["bert"]()
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.endswith("bias"))  # bias-only fine-tuning
    he.prune_heads(model, {0: [1]})
    query = he.get_adapter(model).layers(model)[0].attention.self.query
    assert query.bias.requires_grad and not query.weight.requires_grad


def test_pruning_keeps_dtype():
    model = MODELS["vit"]().to(torch.bfloat16)
    he.prune_heads(model, {0: [0]})
    assert model.vit.layers[0].attention.q_proj.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("name", [*CONTRACT_MODELS, *MORE_CLASSES, "deit_encoder", "dinov2_encoder"])
def test_save_and_load_restore_the_pruned_model(name, tmp_path):
    """Every family, bare encoders included: HF renames old checkpoint keys (ViT, DeiT, DINOv2) for its own classes
    only, and a loader that did not pass as one filled their layers at random (HF only warned)."""
    model = perturb(he.prune_heads(MODELS[name](), PLAN))
    inputs = make_inputs(name)
    he.save_model(model, tmp_path / "member")
    loaded = he.load_model(tmp_path / "member")
    assert type(loaded) is type(model)
    assert he.kept_heads(loaded) == he.kept_heads(model)
    frozen = [{n for n, p in m.named_parameters() if not p.requires_grad} for m in (model, loaded)]
    assert frozen[0] and frozen[0] == frozen[1]  # layer 1's placeholder head stays frozen after the round trip
    saved, back = model.state_dict(), loaded.state_dict()
    assert saved.keys() == back.keys() and all(torch.equal(saved[k], back[k]) for k in saved)
    assert torch.equal(output(loaded, inputs), output(model, inputs))


def test_a_pruned_save_whose_weights_do_not_fit_its_structure_is_refused(tmp_path):
    model = he.prune_heads(MODELS["bert"](), PLAN)
    he.save_model(model, tmp_path / "member")
    weights = tmp_path / "member" / "model.safetensors"
    tensors = safetensors.torch.load_file(weights)
    del tensors["bert.encoder.layer.2.attention.self.query.bias"]  # HF would fill it at random, with a warning
    safetensors.torch.save_file(tensors, weights, metadata={"format": "pt"})
    missing = "does not load whole .missing keys: .'bert.encoder.layer.2.*one save_model call"
    with pytest.raises(ValueError, match=missing):
        he.load_model(tmp_path / "member")
    with pytest.raises(TypeError, match="load_model sets .'output_loading_info'. itself"):
        he.load_model(tmp_path / "member", output_loading_info=True)
    he.save_model(model, tmp_path / "edited")
    config = json.loads((tmp_path / "edited" / "config.json").read_text())
    config["hydra_kept_heads"]["1"] = [0, 1]  # a hand-edited record: layer 1's weights keep other heads
    (tmp_path / "edited" / "config.json").write_text(json.dumps(config))
    mismatched = r"does not load whole .mismatched keys: .*'bert.encoder.layer.1.*hand-edited"
    with pytest.raises(ValueError, match=mismatched):
        he.load_model(tmp_path / "edited")  # was HF's RuntimeError: "look at the above report", naming no key
    with pytest.raises(ValueError, match=r"mismatched keys: .'\(not named by HF: load without ignore_mism"):
        he.load_model(tmp_path / "edited", ignore_mismatched_sizes=False)  # HF's refusal, reworded


def test_a_pruned_save_loaded_at_full_width_is_refused_not_cut_at_the_wrong_heads(tmp_path):
    """HF's size-mismatch error suggests ignore_mismatched_sizes=True: full-width layers of random weights under a
    config that records the pruned map, so positions read from the map zeroed or cut the wrong heads."""
    he.save_model(he.prune_heads(MODELS["bert"](), {0: [0, 1]}), tmp_path / "member")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = T.BertForSequenceClassification.from_pretrained(tmp_path / "member", ignore_mismatched_sizes=True)
    with pytest.raises(
        ValueError,
        match="layer 0 of this BertForSequenceClassification has 4 heads, and its config "
        "records 2 kept.*hydra_ensembles.load_model",
    ):
        with he.ablate_heads(loaded, {0: [3]}):
            pass


def test_grouped_query_attention_and_an_mpnet_layer_without_its_head_ids_are_refused():
    """An adapter added for a GQA encoder would have its query heads' rows cut out of the shared key/value
    projections; MPNet's set_projections without `kept` gave every head head 0's position-bias plane."""
    model = MODELS["bert"]()
    model.config.num_key_value_heads = 2
    with pytest.raises(ValueError, match="grouped-query attention .2 key/value heads for 4 query heads"):
        he.prune_heads(model, {0: [1]})
    mpnet = MODELS["mpnet"]()
    adapter, layer = he.adapters.get_adapter(mpnet), he.adapters.get_adapter(mpnet).layers(mpnet)[0]
    block = adapter.block(layer)
    with pytest.raises(ValueError, match="needs `kept`, the original index of each of the 4 heads"):
        adapter.set_projections(layer, (block.query, block.key, block.value, block.output), num_heads=4)


def test_three_projection_mlps_of_the_dinov2_and_dinov3_families_are_refused_with_the_fix():
    """Their MLP (gate, up, down) has no single input projection to cut neurons from or to fuse."""
    gated = {
        "DINOv2 with use_swiglu_ffn=True": T.Dinov2Model(T.Dinov2Config(**DINOV2, use_swiglu_ffn=True)),
        "DINOv3 with use_gated_mlp=True": T.DINOv3ViTModel(T.DINOv3ViTConfig(**SIZES | IMAGE, use_gated_mlp=True)),
    }
    for said, model in gated.items():
        with pytest.raises(ValueError, match=f"{said} is not supported.*Use a .*checkpoint with the standard MLP"):
            he.HydraEnsemble.fuse([model])


def test_a_layer_that_fails_midway_leaves_the_record_true_to_the_layers_cut(monkeypatch):
    """prune_heads recorded its map only at the end: a failure in layer 2 (out of memory, say)
    left layer 0 cut and recorded as whole."""
    from hydra_ensembles.pruning import heads as heads_module

    model, calls = MODELS["bert"](), []
    real = heads_module._rebuild_attention

    def fail_on_the_second(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("cannot slice this projection")
        return real(*args)

    monkeypatch.setattr(heads_module, "_rebuild_attention", fail_on_the_second)
    with pytest.raises(RuntimeError, match="cannot slice"):
        he.prune_heads(model, {0: [1], 2: [0]})
    assert he.kept_heads(model)[0] == [0, 2, 3] and he.kept_heads(model)[2] == [0, 1, 2, 3]
    assert he.pruning.heads.per_layer(np.int64(2), 3, "budget") == [2, 2, 2]  # numpy / 0-d tensor ints too
    assert he.pruning.heads.per_layer(torch.tensor(1), 3, "budget") == [1, 1, 1]


@pytest.mark.parametrize("name", ["clip_classifier", "siglip_classifier"])
def test_a_classifier_and_its_vision_tower_share_one_head_map(name, tmp_path):
    """Pruned through the classifier, then through its tower (`model.vision_model`, a supported model with its own
    config): both handles see one map, the weights follow it, and the classifier saves and loads whole."""
    model, inputs = at_trained_scale(name), make_inputs(name)
    reference = copy.deepcopy(model)
    he.prune_heads(model, {0: [0]})
    assert he.kept_heads(model.vision_model)[0] == [1, 2, 3] == he.kept_heads(model)[0]
    he.prune_heads(model.vision_model, {0: [3], 1: [2]})  # original numbering through either handle
    assert he.kept_heads(model) == he.kept_heads(model.vision_model) and he.kept_heads(model)[0] == [1, 2]
    with he.ablate_heads(reference, {0: [0, 3], 1: [2]}):
        ablated = output(reference, inputs)
    assert (output(model, inputs) - ablated).abs().max().item() <= CONTRACT
    he.save_model(model, tmp_path / "classifier")
    assert (output(he.load_model(tmp_path / "classifier"), inputs) - ablated).abs().max().item() <= CONTRACT

    tower_only = at_trained_scale(name)  # pruned through the tower alone, saved by HF's own save_pretrained
    fingerprint = he.pruning.persist.base_fingerprint(tower_only)
    he.prune_heads(tower_only.vision_model, {1: [0]})
    perturb(tower_only)  # fine-tuned: its identity is the one recorded at the first pruning, for either handle
    assert he.pruning.persist.base_fingerprint(tower_only) == fingerprint
    assert he.pruning.persist.base_fingerprint(tower_only.vision_model) == fingerprint
    tower_only.save_pretrained(tmp_path / "hf")
    loaded = he.load_model(tmp_path / "hf")
    assert he.kept_heads(loaded)[1] == [1, 2, 3]
    assert (output(loaded, inputs) - output(tower_only, inputs)).abs().max().item() <= CONTRACT


def test_a_two_tower_model_pruned_through_a_tower_is_refused_on_load_with_the_fix(tmp_path):
    """A CLIPModel (not supported whole) with its text tower pruned: its top-level config records nothing, the
    tower's does. Loading failed in HF's loader, or with ignore_mismatched_sizes loaded random attention weights."""
    import transformers as T

    tower = {"hidden_size": 32, "intermediate_size": 37, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS}
    config = T.CLIPConfig(
        text_config=tower | {"vocab_size": 99},
        vision_config=tower | {"image_size": 30, "patch_size": 10},
        projection_dim=16,
    )
    model = T.CLIPModel(config)
    he.prune_heads(model.text_model, {0: [1]})
    he.save_model(model, tmp_path / "m")
    with pytest.raises(ValueError, match="has a pruned tower .*Save the pruned tower itself with save_model"):
        he.load_model(tmp_path / "m", ignore_mismatched_sizes=True)


def test_a_pruned_encoder_built_without_its_pooler_is_loaded_by_the_keyword_its_error_names(tmp_path):
    model = he.prune_heads(T.BertModel(MODELS["bert"]().config, add_pooling_layer=False).eval(), {0: [1]})
    he.save_model(model, tmp_path / "encoder")
    with pytest.raises(ValueError, match=r"saved without its pooler.*load_model\(path, add_pooling_layer=False\)"):
        he.load_model(tmp_path / "encoder")  # was: "a hand-edited config ... Save it again" (which failed alike)
    loaded = he.load_model(tmp_path / "encoder", add_pooling_layer=False)
    inputs = {k: v for k, v in make_inputs("bert").items() if k != "labels"}
    assert torch.equal(loaded(**inputs).last_hidden_state, model(**inputs).last_hidden_state)


class MyClassifier(T.BertForSequenceClassification):
    """A user's own subclass: pruned through its HF parent's adapter."""


def test_a_pruned_subclass_of_ours_names_the_class_to_load_it_as(tmp_path):
    model = he.prune_heads(MyClassifier(MODELS["bert"]().config), {0: [1]})
    he.save_model(model, tmp_path / "mine")
    with pytest.raises(ValueError, match="names 'MyClassifier', which transformers does not define.*derives from"):
        he.load_model(tmp_path / "mine")
    config = json.loads((tmp_path / "mine" / "config.json").read_text())
    (tmp_path / "mine" / "config.json").write_text(
        json.dumps(config | {"architectures": ["BertForSequenceClassification"]})
    )
    assert he.kept_heads(he.load_model(tmp_path / "mine"))[0] == [0, 2, 3]


def test_load_model_also_loads_unpruned_models(tmp_path):
    model = MODELS["bert"]()
    model.save_pretrained(tmp_path / "plain")
    assert torch.equal(
        output(he.load_model(tmp_path / "plain"), make_inputs("bert")), output(model, make_inputs("bert"))
    )


@pytest.mark.parametrize(
    "plan, message",
    [
        ({LAYERS: [0]}, "layer 3 is out of range"),
        ({0: [HEADS]}, r"head\(s\) \[4\] of layer 0 are out of range"),
        ({0: [-1]}, "out of range"),
        ([0, 1], "must be a dict"),
        ({0: [1.9]}, "head ids must be integers, got 1.9"),  # int() pruned head 1
        ({0: "13"}, "must be a list of head ids"),  # pruned heads 1 and 3, one per character
        ({0: [True]}, "head ids must be integers, got True"),
        ({0: torch.tensor([True, True, False, False])}, "head ids must be integers, got tensor.True."),  # a mask
        ({0: 1}, r"must be a list of head ids \(\{layer: \[head, ...\]\}\), got 1"),
        ({1.7: [0]}, "the layers of the heads to prune must be integers, got 1.7"),  # int() pruned layer 1
        ({True: [0]}, "must be integers, got True"),
        ({0: [1], "0": [2]}, r"names layer 0 twice \(as '0' and another key\)"),  # head 1's request was dropped
        ({"a": [0]}, "the layers of the heads to prune must be integers, got 'a'"),
    ],
)
def test_bad_head_indices_are_rejected(plan, message):
    with pytest.raises((ValueError, TypeError), match=message):
        he.prune_heads(MODELS["bert"](), plan)
    if any(True if isinstance(layer, bool) else not isinstance(layer, int) for layer in plan):  # the layer keys
        with pytest.raises((ValueError, TypeError), match=message.replace("heads to prune", "head map")):
            he.keep_heads(MODELS["bert"](), plan)


def test_json_layer_keys_are_layers_and_neuron_maps_are_checked_alike():
    assert he.kept_heads(he.prune_heads(MODELS["bert"](), {"1": [0]}))[1] == [1, 2, 3]  # a map read back from JSON
    with pytest.raises(ValueError, match="names layer 0 twice"):
        he.prune_neurons(MODELS["bert"](), {0: [1], "0": [2]})
    with pytest.raises(TypeError, match="the layers of the neurons to prune must be integers, got 0.5"):
        he.prune_neurons(MODELS["bert"](), {0.5: [1]})
    with pytest.raises(TypeError, match="the layers of the neurons to ablate must be integers, got '²'"):
        with he.pruning.ablate_neurons(MODELS["bert"](), {"²": [1]}):  # a digit to str.isdigit, not to int()
            pass


@pytest.mark.parametrize("budget", [[1.9, 2, 2], np.array([2.7, 3.1, 1.0]), torch.tensor(2.7), True, "333", 2.0])
def test_a_per_layer_count_is_whole_numbers_not_rounded_down(budget):
    """`budget` and `pool` of sample_members, sequential_budget of Taylor scores: int() read 1.9 as 1, "333" as 3
    per layer, True as 1."""
    with pytest.raises(TypeError, match=r"budget must be (integers|an int >= 0)"):
        he.pruning.heads.per_layer(budget, 3, "budget")


def test_a_lora_wrapped_projection_is_refused_before_any_layer_is_cut():
    """peft's lora.Linear exposes its base layer's weight: it was sliced into a plain nn.Linear and the trained A and
    B were dropped without a word (the pruned model differed from the ablated one by 0.26)."""
    import peft

    model = MODELS["bert"]()
    config = peft.LoraConfig(r=2, target_modules=["query", "value"], init_lora_weights=False)
    wrapped = peft.get_peft_model(model, config).base_model.model
    before = {name: p.clone() for name, p in wrapped.named_parameters()}
    for prune, plan in ((he.prune_heads, {0: [1]}), (he.keep_heads, {1: [0]})):
        with pytest.raises(ValueError, match=r"wrapped projections \(Linear\).*merge_and_unload\(\)"):
            prune(wrapped, plan)
    lora_output = peft.get_peft_model(MODELS["bert"](), peft.LoraConfig(r=2, target_modules=["attention.output.dense"]))
    with pytest.raises(ValueError, match="wrapped projections"):  # zeroing W_o's columns left B A adding the head
        he.ablate_heads(lora_output.base_model.model, {0: [1]}).__enter__()
    with pytest.raises(ValueError, match="wrapped projections"):  # was a KeyError on '...query.base_layer.weight'
        he.HydraEnsemble.fuse([wrapped])
    assert he.kept_heads(wrapped) == {layer: list(range(HEADS)) for layer in range(LAYERS)}  # nothing cut
    assert all(torch.equal(p, before[name]) for name, p in wrapped.named_parameters())
    mlp = peft.get_peft_model(MODELS["bert"](), peft.LoraConfig(r=2, target_modules=["intermediate.dense"]))
    with pytest.raises(ValueError, match="wrapped projections"):
        he.prune_neurons(mlp.base_model.model, {0: [1]})
    merged = peft.get_peft_model(MODELS["bert"](), config).merge_and_unload()  # the fix the message names
    assert he.kept_heads(he.prune_heads(merged, {0: [1]}))[0] == [0, 2, 3]


def test_pruning_an_already_pruned_head_is_rejected():
    model = he.prune_heads(MODELS["bert"](), {0: [1]})
    with pytest.raises(ValueError, match="already pruned"):
        he.prune_heads(model, {0: [1]})


def test_unsupported_architecture_names_the_supported_ones():
    import transformers as T

    model = T.GPT2Model(T.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=10))
    with pytest.raises(
        he.UnsupportedModelError, match="no adapter for GPT2Model.*BertForSequenceClassification.*register_adapter"
    ):
        he.prune_heads(model, {0: [0]})


def test_clip_model_error_points_at_its_towers():
    import transformers as T

    config = T.CLIPConfig(
        text_config=dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8),
        vision_config=dict(
            hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8, image_size=8, patch_size=4
        ),
    )
    with pytest.raises(he.UnsupportedModelError, match="model.text_model or model.vision_model"):
        he.kept_heads(T.CLIPModel(config))


def test_load_model_of_a_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        he.load_model(tmp_path / "nowhere")
