"""HydraEnsemble beyond the contracts: saving and loading, atomic saves, and bad members."""

import copy
import json

import pytest
import safetensors.torch
import torch
import transformers as T
from conftest import MODELS, VOCAB, at_trained_scale, fused_output, make_inputs, output, perturb, random_head_maps
from tolerances import CONTRACT

import hydra_ensembles as he
from hydra_ensembles.export import export_program
from hydra_ensembles.fusion import ensemble as ensemble_module
from hydra_ensembles.fusion import lay_out_for_device
from hydra_ensembles.fusion.layer import ragged_by_default
from hydra_ensembles.io import weights_digest
from hydra_ensembles.pruning import base_fingerprint


@pytest.mark.parametrize(
    "name",
    [
        "bert",
        "dinov2",
        "clip_text",
        "clip_classifier",
        "siglip_text",
        "siglip_vision",
        "modernbert",
        "modernbert_encoder",
        "deberta",
        "deberta_p2c",
        "deberta_c2p",
        "mpnet",
    ],
)
@pytest.mark.parametrize("mlp", ["average", "stack"])
def test_reload_gives_identical_outputs(name, mlp, tmp_path):
    members = [perturb(m, seed=i) for i, m in enumerate(he.build_members(MODELS[name](), random_head_maps(3, seed=7)))]
    ensemble = he.HydraEnsemble.fuse(members, mlp=mlp)
    ensemble.save_pretrained(tmp_path / "hydra")
    loaded = he.HydraEnsemble.from_pretrained(tmp_path / "hydra")
    inputs = make_inputs(name)
    assert torch.equal(fused_output(loaded, inputs), fused_output(ensemble, inputs))
    assert loaded.head_maps == ensemble.head_maps and loaded.mlp == mlp
    assert he.count_parameters(loaded) == he.count_parameters(ensemble)


def test_members_built_without_a_pooler_fuse_exactly_and_reload(tmp_path):
    """BertModel(config, add_pooling_layer=False) (as ViTModel, MPNetModel, ...): the fused skeleton is built
    without the pooler too, so its head reads the [CLS] state as the members' does; the save records it."""
    torch.manual_seed(0)
    base = T.BertModel(MODELS["bert_encoder"]().config, add_pooling_layer=False).eval()
    members = [perturb(m, seed=i) for i, m in enumerate(he.build_members(base, random_head_maps(3, seed=7)))]
    ensemble = he.HydraEnsemble.fuse(members, mlp="stack")
    inputs = make_inputs("bert_encoder")
    fused = fused_output(ensemble, inputs)
    for index, member in enumerate(members):
        assert (fused[:, index] - output(member, inputs)).abs().max().item() <= CONTRACT
    ensemble.save_pretrained(tmp_path / "hydra")
    assert torch.equal(fused_output(he.HydraEnsemble.from_pretrained(tmp_path / "hydra"), inputs), fused)


def test_untie_keeps_outputs_and_what_was_frozen_and_fuse_takes_a_module_list():
    """untie gives each member its own copy of the shared tensors (the embeddings here: members pruned from one
    model share them); a tensor frozen before stays frozen after, by name. fuse accepts an nn.ModuleList."""
    members = torch.nn.ModuleList(he.build_members(MODELS["bert"](), random_head_maps(3, seed=7)))
    ensemble = he.HydraEnsemble.fuse(members, mlp="stack")
    inputs = make_inputs("bert")
    before = fused_output(ensemble, inputs)
    frozen = [name for name, p in ensemble.outer.named_parameters() if "embeddings" in name]
    assert frozen and all(name.startswith("shared.") for name in frozen)
    for name, p in ensemble.outer.named_parameters():
        p.requires_grad_(name not in frozen)
    ensemble.untie()
    after = dict(ensemble.outer.named_parameters())
    embeddings = [name for name in after if "embeddings" in name]
    assert embeddings and all(name.startswith("member.") and not after[name].requires_grad for name in embeddings)
    assert all(p.requires_grad for name, p in after.items() if name not in embeddings)
    assert torch.equal(fused_output(ensemble, inputs), before)


def test_an_ensemble_saved_zero_padded_loads_ragged_with_the_same_outputs(tmp_path):
    """Ensembles saved before the ragged layout hold members with uneven head counts zero-padded to the widest
    (3-D q/k/v and W_o tensors): they load, converted to the ragged layout, and predict what they did."""
    members = [
        perturb(m, seed=i) for i, m in enumerate(he.build_members(MODELS["mpnet"](), random_head_maps(3, seed=7)))
    ]
    ensemble = he.HydraEnsemble.fuse(members, mlp="stack")
    assert any(layer.ragged for layer in ensemble.layers)
    saved_padded = copy.deepcopy(ensemble).set_layout("padded")
    saved_padded.save_pretrained(tmp_path / "hydra")
    state = safetensors.torch.load_file(tmp_path / "hydra" / ensemble_module.WEIGHTS_NAME)
    assert all(state[f"layers.{i}.qkv_weight"].dim() == 3 for i in range(len(ensemble.layers)))  # the old layout
    loaded = he.HydraEnsemble.from_pretrained(tmp_path / "hydra")
    assert [layer.ragged for layer in loaded.layers] == [layer.ragged for layer in ensemble.layers]
    inputs = make_inputs("mpnet")
    assert (fused_output(loaded, inputs) - fused_output(ensemble, inputs)).abs().max().item() <= CONTRACT
    stored = [sum(p.numel() for p in model.parameters()) for model in (loaded, saved_padded)]
    assert stored[0] < stored[1]  # the padding is gone
    assert he.count_parameters(loaded) == he.count_parameters(saved_padded) == stored[0]  # and never counted


def test_the_layout_follows_the_device_with_the_same_outputs():
    """Uneven head counts run ragged on the CPU and padded elsewhere: on a GPU the ragged layout's per-member
    matmuls cost more than the padded heads (an H100: 1.37x padded's latency at batch 1-4). An ensemble moved to
    another kind of device is laid out for it by `lay_out_for_device` (the CLI and `inference.prepare` run it), in
    place: only q/k/v/o are replaced, each keeping its requires_grad, and the head-index buffers follow the
    device. Every layout computes the same outputs. The meta device stands in for an accelerator."""
    maps = [{0: [0], 1: [0, 1], 2: [0, 3]}, {0: [1, 2], 1: [2, 3], 2: [0, 2, 3]}]  # layer 1 even
    members = [perturb(m, seed=i) for i, m in enumerate(he.build_members(MODELS["mpnet"](), maps))]
    ensemble = he.HydraEnsemble.fuse(members, mlp="stack")
    uneven = [True, False, True]
    assert [layer.ragged for layer in ensemble.layers] == uneven
    padded = copy.deepcopy(ensemble).set_layout("padded")
    assert not any(layer.ragged for layer in padded.layers)
    inputs = make_inputs("mpnet")  # MPNet: a shared position bias, read through the head-index buffers
    assert (fused_output(padded, inputs) - fused_output(ensemble, inputs)).abs().max().item() <= CONTRACT
    assert [layer.ragged for layer in padded.set_layout().layers] == uneven  # "auto": the CPU's
    assert (fused_output(padded, inputs) - fused_output(ensemble, inputs)).abs().max().item() <= CONTRACT

    moved = copy.deepcopy(ensemble).to("meta")
    assert [layer.ragged for layer in moved.layers] == uneven  # moving alone changes nothing
    layer0, mlp_weight = moved.layers[0], moved.layers[0].mlp_in_weight
    moved.layers[0].qkv_weight.requires_grad_(False)
    lay_out_for_device(moved)
    assert not any(layer.ragged for layer in moved.layers)
    assert moved.layers[0] is layer0 and layer0.mlp_in_weight is mlp_weight  # in place, the MLP untouched
    assert not layer0.qkv_weight.requires_grad and layer0.o_weight.requires_grad
    assert all(buffer.device.type == "meta" for layer in moved.layers for buffer in layer.buffers())
    assert not ragged_by_default([2, 3], torch.device("cuda"))  # what fusing on a GPU and loading onto one take
    with pytest.raises(ValueError, match="layout must be"):
        ensemble.set_layout("sparse")
    # the circuit search scores candidates on a one-member layer: a padded layer of two is refused by its count
    # (it passed the ragged-only check and failed in a reshape)
    with pytest.raises(ValueError, match="scored on a one-member layer; this one has 2 members"):
        padded.set_layout("padded").layers[1].ablation_candidates(torch.zeros(2, 4, 10, 32), None, [0])


def test_the_weights_digest_names_the_weights_not_the_layout():
    """The bench's records tell a cached model from a rebuilt one by `weights_digest`; a fused ensemble's tensors
    are laid out by its device, so the digest reads a layer's padded layout whatever it holds. Wrapped (the
    temperature-scaled rows digest a wrapper), the same holds; a changed weight changes it."""
    maps = [{0: [0], 1: [0, 1]}, {0: [1, 2], 1: [2, 3]}]  # layer 0 uneven
    ensemble = he.HydraEnsemble.fuse(he.build_members(MODELS["bert"](), maps))
    assert ensemble.layers[0].ragged
    padded = copy.deepcopy(ensemble).set_layout("padded")
    assert weights_digest(padded) == weights_digest(ensemble)
    assert weights_digest(torch.nn.Sequential(padded)) == weights_digest(torch.nn.Sequential(ensemble))
    with torch.no_grad():
        ensemble.layers[0].qkv_weight[0, 0] += 1e-3  # member 0's first head
    assert weights_digest(ensemble) != weights_digest(padded)


def test_a_crashed_save_leaves_the_previous_save_intact(tmp_path, monkeypatch):
    inputs = make_inputs("bert")
    first = he.HydraEnsemble.fuse(he.build_members(MODELS["bert"](), random_head_maps(2, seed=1)))
    first.save_pretrained(tmp_path / "hydra")
    second = he.HydraEnsemble.fuse(he.build_members(MODELS["bert"](seed=1), random_head_maps(3, seed=2)))

    def crash_midway(tensors, filename, metadata=None):
        open(filename, "wb").write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        second.save_pretrained(tmp_path / "hydra")
    monkeypatch.undo()
    reloaded = he.HydraEnsemble.from_pretrained(tmp_path / "hydra")
    assert torch.equal(fused_output(reloaded, inputs), fused_output(first, inputs))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hydra"]  # no partial directories left behind


def test_a_swap_cut_between_its_two_renames_is_recovered(tmp_path):
    ensemble = he.HydraEnsemble.fuse([MODELS["vit"]()])
    ensemble.save_pretrained(tmp_path / "hydra")
    (tmp_path / "hydra").rename(tmp_path / ".hydra.hydra-previous")  # the state right after the first rename
    reloaded = he.HydraEnsemble.from_pretrained(tmp_path / "hydra")
    inputs = make_inputs("vit")
    assert torch.equal(fused_output(reloaded, inputs), fused_output(ensemble, inputs))


def test_loading_a_directory_without_an_ensemble_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a saved Hydra Ensemble"):
        he.HydraEnsemble.from_pretrained(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        he.HydraEnsemble.from_pretrained(tmp_path / "missing")


def test_an_ensemble_of_another_format_or_model_class_says_which_version_reads_it(tmp_path):
    members = he.build_members(MODELS["bert"](), random_head_maps(2, seed=0, min_heads=1))
    he.HydraEnsemble.fuse(members).save_pretrained(tmp_path / "hydra")
    config = tmp_path / "hydra" / ensemble_module.CONFIG_NAME
    saved = json.loads(config.read_text())
    config.write_text(json.dumps(saved | {"format_version": 99, "library_version": "9.9"}))
    with pytest.raises(ValueError, match="format version 99, written by hydra-ensembles 9.9;.*fuse its members again"):
        he.HydraEnsemble.from_pretrained(tmp_path / "hydra")
    config.write_text(json.dumps(saved | {"model_class": "BertForFutureTasks"}))
    with pytest.raises(ValueError, match="BertForFutureTasks, which transformers .* does not have: install"):
        he.HydraEnsemble.from_pretrained(tmp_path / "hydra")


def test_members_from_different_base_models_are_rejected():
    a = he.build_members(MODELS["bert"](seed=0), random_head_maps(1, seed=0))
    b = he.build_members(MODELS["bert"](seed=1), random_head_maps(1, seed=1))
    with pytest.raises(ValueError, match="different base models"):
        he.HydraEnsemble.fuse(a + b)


def test_a_bert_decoder_is_refused_it_attends_causally():
    """HF runs a BERT-family model with is_decoder=True causally; the fused engine ran it bidirectionally, so a
    fused ensemble of it differed from its members, silently. Pruning it stays exact (not refused)."""
    from conftest import SIZES

    decoder = T.BertModel(T.BertConfig(vocab_size=VOCAB, max_position_embeddings=24, is_decoder=True, **SIZES))
    members = he.build_members(decoder, random_head_maps(2, seed=0))
    with pytest.raises(ValueError, match="BertModel cannot be fused: its config has is_decoder=True"):
        he.HydraEnsemble.fuse(members)


def test_fine_tuned_members_keep_their_base_fingerprint():
    base = MODELS["bert"]()
    members = he.build_members(base, random_head_maps(2, seed=0))
    perturb(members[1])  # embeddings change under fine-tuning; the recorded fingerprint does not
    ensemble = he.HydraEnsemble.fuse(members, mlp="stack")
    assert ensemble.fingerprint == base_fingerprint(members[1]) == base_fingerprint(base)  # the checkpoint's
    perturb(base)  # computed afresh, a model never pruned: another checkpoint
    assert base_fingerprint(base) != ensemble.fingerprint


def test_members_with_different_classifiers_are_rejected():
    import transformers as T

    model = MODELS["bert"]()
    other = copy.deepcopy(model)
    other.config.num_labels = 5
    other.classifier = torch.nn.Linear(32, 5)
    with pytest.raises(ValueError, match="different classifiers: num_labels"):
        he.HydraEnsemble.fuse([model, other])
    swapped = copy.deepcopy(model)  # same count, classes in the other order: probabilities would mix classes
    swapped.config.id2label = {0: "pos", 1: "neg"}
    model.config.id2label = {0: "neg", 1: "pos"}
    with pytest.raises(
        ValueError, match=r"different classifiers: id2label: member 0 names its classes \['neg', 'pos'\]"
    ):
        he.HydraEnsemble.fuse([model, swapped])
    encoder = T.BertModel(model.config)
    with pytest.raises(ValueError, match="mix model classes"):
        he.HydraEnsemble.fuse([model, encoder])


@pytest.mark.parametrize(
    "members, mlp, message",
    [([], "average", "non-empty list"), (None, "average", "non-empty"), ("one", "median", "'average' or 'stack'")],
)
def test_bad_fuse_arguments(members, mlp, message):
    members = [MODELS["bert"]()] if members == "one" else members
    with pytest.raises(ValueError, match=message):
        he.HydraEnsemble.fuse(members, mlp=mlp)


def test_wrong_inputs_are_named():
    ensemble = he.HydraEnsemble.fuse([MODELS["bert"]()])
    with pytest.raises(ValueError, match=r"missing input\(s\) \['input_ids'\]"):
        ensemble(attention_mask=torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="input_ids must be a \\(batch, seq_len\\) tensor, got \\(7,\\)"):
        ensemble(input_ids=torch.ones(7, dtype=torch.long))
    with pytest.raises(ValueError, match="unexpected input"):
        ensemble(input_ids=torch.ones(1, 3, dtype=torch.long), pixel_values=torch.zeros(1, 3, 4, 4))
    with pytest.raises(ValueError, match="disagree in shape"):
        ensemble(input_ids=torch.ones(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 4, dtype=torch.long))
    labelled = make_inputs("bert") | {"labels": torch.zeros(4, dtype=torch.long)}
    assert ensemble(**labelled).member_logits.shape == (4, 1, 3)  # labels are ignored


def test_mixed_devices_or_dtypes_are_rejected():
    members = he.build_members(MODELS["vit"](), random_head_maps(2, seed=0))
    members[1].to(torch.float64)
    with pytest.raises(ValueError, match="devices/dtypes"):
        he.HydraEnsemble.fuse(members)


def test_ensemble_moves_with_to(tmp_path):
    ensemble = he.HydraEnsemble.fuse(he.build_members(MODELS["vit"](), random_head_maps(2, seed=0))).to(torch.float64)
    out = ensemble(pixel_values=torch.randn(2, 3, 16, 16, dtype=torch.float64))
    assert out.member_logits.dtype == torch.float64


def test_module_repr_lists_members():
    ensemble = he.HydraEnsemble.fuse(he.build_members(MODELS["vit"](), random_head_maps(2, seed=0)))
    assert "members=2" in repr(ensemble) and ensemble_module.CONFIG_NAME == "hydra_config.json"


def test_chunked_forward_equals_one_pass():
    members = [
        perturb(m, seed=i) for i, m in enumerate(he.build_members(MODELS["bert"](), random_head_maps(3, seed=2)))
    ]
    ensemble = he.HydraEnsemble.fuse(members, mlp="stack")
    inputs = make_inputs("bert", batch=7)
    ensemble.max_rows = None
    whole = ensemble(**inputs, output_hidden_states=True)
    ensemble.max_rows = 3 * 10 * 2  # two examples per chunk: 4 chunks
    chunked = ensemble(**inputs, output_hidden_states=True)
    # the same rows through matmuls of other sizes (another blocking): rounding only, as in the contracts
    assert (chunked.member_logits - whole.member_logits).abs().max() <= CONTRACT
    assert (chunked.member_hidden_states - whole.member_hidden_states).abs().max() <= CONTRACT


def test_a_chunked_forward_passes_scalar_tensor_inputs_whole():
    """A 0-d tensor input (`interpolate_pos_encoding=torch.tensor(False)`) is no row of the batch: not sliced."""
    ensemble = he.HydraEnsemble.fuse(he.build_members(MODELS["vit"](), random_head_maps(2, seed=2)), mlp="stack")
    ensemble.max_rows = 2 * 17 * 2  # two examples per chunk
    inputs = make_inputs("vit", batch=5)
    flagged = ensemble(**inputs, interpolate_pos_encoding=torch.tensor(False)).member_logits
    assert torch.equal(flagged, ensemble(**inputs).member_logits)


def test_only_the_cpu_runs_a_batch_in_chunks():
    """Off the CPU one pass: on a GPU chunks only add kernel launches (an H100 ran a ViT-B/16 ensemble's batch of 32
    in 6 chunks at 6x one model's latency, in one pass at 2.9x). The meta device stands in for an accelerator."""
    ensemble = he.HydraEnsemble.fuse(he.build_members(MODELS["bert"](), random_head_maps(3, seed=2)), mlp="stack")
    ensemble.max_rows = 3 * 10 * 2  # two examples per chunk
    inputs, passes = make_inputs("bert", batch=7), []
    run_layers = ensemble.run_layers
    ensemble.run_layers = lambda *args, **kwargs: passes.append(1) or run_layers(*args, **kwargs)
    ensemble(**inputs)
    assert len(passes) == 4
    passes.clear()
    out = ensemble.to("meta")(**{k: v.to("meta") for k, v in inputs.items()})
    assert len(passes) == 1 and out.member_logits.shape == (7, 3, 3)


@pytest.mark.parametrize("name", ["bert", "mpnet", "dinov2"])
def test_the_states_a_prefix_keeps_are_every_members_own(name):
    """`prefix`'s state entering layer k, run on from k, gives what the whole forward gives, for every k: past the
    shared trunk each member has its own stream (one stream against M members' weights was member 0's alone)."""
    maps = [{0: [0, 1], 1: [0, 1], 2: [0]}, {0: [2, 3], 1: [2, 3], 2: [1]}]
    engine = he.HydraEnsemble.fuse(he.build_members(MODELS[name](), maps), mlp="stack").eval()
    with torch.no_grad():
        states, mask = engine.prefix(make_inputs(name), engine.num_layers - 1)
        whole = engine.run_layers(states[0], mask)
        for k, state in enumerate(states):
            assert (engine.run_layers(state, mask, start=k) - whole).abs().max() <= CONTRACT, k
    assert states[-1].shape[0] == 2


def test_an_mpnet_row_with_every_token_masked_equals_hf():
    """HF fills masked scores with the dtype's lowest value, so a row with no token left attends evenly; -inf
    would make it another value (or NaN)."""
    model, inputs = at_trained_scale("mpnet"), make_inputs("mpnet")
    inputs["attention_mask"][0] = 0
    members = he.build_members(model, random_head_maps(2, seed=3, min_heads=1))
    expected = torch.stack([output(m, inputs) for m in members], dim=1)
    assert (fused_output(he.HydraEnsemble.fuse(members), inputs) - expected).abs().max().item() <= CONTRACT


def test_an_encoder_whose_weights_are_all_embeddings_or_layers_is_exported_as_it_runs():
    """A DistilBERT or DeBERTa encoder has no head weights: fused members sharing their embeddings leave nothing
    per member, and the loop `torch.export` runs over members took their count from those tensors."""
    config = T.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=3, n_heads=4, hidden_dim=37)
    torch.manual_seed(0)
    model, inputs = T.DistilBertModel(config), make_inputs("distilbert")
    ensemble = he.HydraEnsemble.fuse(he.build_members(model, random_head_maps(2, seed=1, min_heads=1)))
    program = export_program(ensemble, inputs)  # a real torch.export trace
    with torch.no_grad():
        eager, exported = ensemble(**inputs).member_pooled, program.module()(inputs)
    assert eager.shape == (4, 2, 32)
    torch.testing.assert_close(exported, eager, atol=CONTRACT, rtol=0)
