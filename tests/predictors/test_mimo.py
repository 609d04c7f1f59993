"""MIMO: M inputs mixed into one ViT through summed patch embeddings, M heads; trained with seeded draws."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import MODELS, killed_at_step, labelled_batches, make_inputs, output
from tolerances import CONTRACT

import hydra_ensembles as he
from hydra_ensembles.predictors import MIMO, load_predictor, mimo, save_predictor, train_mimo
from hydra_ensembles.predictors.baselines.mimo import MIMOTrainingOutput, draw_permutations
from hydra_ensembles.training import IMAGE_RECIPE, MIMOLoss

RECIPE = IMAGE_RECIPE.with_(epochs=2, lr=1e-3, optimizer="adamw", patience=None)


def _plain_member(network: MIMO, m: int) -> torch.nn.Module:
    """A plain ViT of the model's c channels and C classes: the MIMO trunk, a patch embedding whose weight is the
    sum of the M inputs' convolutions, and head m."""
    config = copy.deepcopy(network.model.config)
    channels, classes = config.num_channels, config.num_labels
    plain = type(network.model)(config).eval()
    state = dict(network.model.state_dict())
    weight = state.pop("vit.embeddings.patch_embeddings.inner.projection.weight")  # (d, M*c, p, p)
    state["vit.embeddings.patch_embeddings.projection.bias"] = state.pop(
        "vit.embeddings.patch_embeddings.inner.projection.bias"
    )
    state["vit.embeddings.patch_embeddings.projection.weight"] = weight.view(
        weight.shape[0], network.members, channels, *weight.shape[2:]
    ).sum(1)
    state["classifier.weight"] = state["classifier.weight"][m * classes : (m + 1) * classes]
    state["classifier.bias"] = state["classifier.bias"][m * classes : (m + 1) * classes]
    plain.load_state_dict(state)
    return plain


def test_the_same_image_at_every_input_is_a_vit_with_the_summed_patch_embedding():
    model, inputs = MODELS["vit"](), make_inputs("vit")
    network = mimo(model, members=3, seed=0)
    with torch.no_grad():
        got = network(**inputs).member_logits
    assert got.shape == (4, 3, 5)
    for m in range(3):
        assert (got[:, m] - output(_plain_member(network, m), inputs)).abs().max() <= CONTRACT
    assert not torch.allclose(got[:, 0], got[:, 1])


def test_draws_are_seeded_permutations_of_the_repeated_batch():
    torch.manual_seed(3)
    first = draw_permutations(batch=8, members=3, repetition=4, rho=0.5)
    torch.manual_seed(3)
    again = draw_permutations(batch=8, members=3, repetition=4, rho=0.5)
    assert first.shape == (3, 32) and torch.equal(first, again)
    torch.manual_seed(4)
    assert not torch.equal(draw_permutations(8, 3, 4, 0.5), first)
    for row in first:  # each example R times in every member's draw
        assert torch.equal(torch.bincount(row, minlength=8), torch.full((8,), 4))
    same = (first == first[0]).all(0)  # rows where every member reads the same example
    assert same[16:].all() and not same[:16].all()  # rho = 0.5: the last half is common, the first half apart


def test_rho_one_gives_every_member_the_same_draw_and_rho_zero_different_ones():
    torch.manual_seed(0)
    repeated = draw_permutations(batch=8, members=3, repetition=2, rho=1.0)
    assert all(torch.equal(row, repeated[0]) for row in repeated)
    apart = draw_permutations(batch=8, members=3, repetition=2, rho=0.0)
    assert not torch.equal(apart[0], apart[1]) and not torch.equal(apart[1], apart[2])


def test_training_mode_feeds_each_member_its_draw():
    model, inputs = MODELS["vit"](), make_inputs("vit")
    network = mimo(model, members=3, batch_repetition=2, seed=0).train()
    for module in network.modules():  # dropout off: compare with eval outputs
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    torch.manual_seed(5)
    out = network(**inputs)
    assert isinstance(out, MIMOTrainingOutput) and out.member_logits.shape == (8, 3, 5)
    pixels = inputs["pixel_values"]
    for row in range(8):  # every row: a member paired with another member's draw fails on the shuffled rows
        stacked = torch.cat([pixels[out.permutations[m, row]] for m in range(3)])[None]  # (1, M*c, H, W)
        with torch.no_grad():
            expected = network.model(pixel_values=stacked).logits.view(3, 5)  # the M inputs as drawn
        assert torch.allclose(out.member_logits[row], expected, atol=CONTRACT)
    assert not torch.equal(out.permutations[0], out.permutations[1])  # the members did read different images


def test_mimo_loss_sums_each_members_cross_entropy_on_the_labels_it_read():
    logits = torch.randn(6, 2, 4)
    permutations = torch.tensor([[0, 1, 2, 0, 1, 2], [2, 2, 1, 1, 0, 0]])
    labels = torch.tensor([3, 0, 1])
    loss = MIMOLoss()(MIMOTrainingOutput(logits, permutations), {"labels": labels})
    expected = F.cross_entropy(logits[:, 0], torch.tensor([3, 0, 1, 3, 0, 1])) + F.cross_entropy(
        logits[:, 1], torch.tensor([1, 1, 0, 0, 3, 3])
    )
    assert torch.allclose(loss, expected)


def test_training_through_the_loop_is_seeded_and_a_killed_run_resumes_to_the_same_weights(tmp_path):
    model = MODELS["vit"]()
    uninterrupted = train_mimo(mimo(model, seed=0), labelled_batches(), RECIPE, progress=False)
    again = train_mimo(mimo(model, seed=0), labelled_batches(), RECIPE, progress=False)
    with killed_at_step(5):  # 3 steps per epoch: the 2nd step of epoch 2
        train_mimo(mimo(model, seed=0), labelled_batches(), RECIPE, checkpoint_dir=tmp_path, progress=False)
    resumed = train_mimo(mimo(model, seed=0), labelled_batches(), RECIPE, checkpoint_dir=tmp_path, progress=False)
    untrained = mimo(model, seed=0)
    for a, b, c in zip(*(m.state_dict().values() for m in (uninterrupted, again, resumed))):
        assert torch.equal(a, b) and torch.equal(a, c)  # the draws too: seeded per epoch by the loop
    assert any(
        not torch.equal(a, u) for a, u in zip(uninterrupted.state_dict().values(), untrained.state_dict().values())
    )
    assert not resumed.training and len(resumed.training_history) == 2
    with killed_at_step(5):
        train_mimo(mimo(model, seed=0), labelled_batches(), RECIPE, checkpoint_dir=tmp_path / "b", progress=False)
    with pytest.raises(ValueError, match="another model training setting .MIMO's rho"):  # same weights, other draws
        train_mimo(mimo(model, rho=0.25, seed=0), labelled_batches(), RECIPE, checkpoint_dir=tmp_path / "b")


def test_saves_loads_and_counts_its_costs(tmp_path):
    model, inputs = MODELS["vit"](), make_inputs("vit")
    network = mimo(model, members=3, rho=0.5, batch_repetition=4, seed=0)
    save_predictor(network, tmp_path / "mimo")
    loaded = load_predictor(tmp_path / "mimo")
    assert isinstance(loaded, MIMO) and (loaded.rho, loaded.batch_repetition, loaded.num_members) == (0.5, 4, 3)
    assert he.predictors.describe_saved(tmp_path / "mimo") == "a MIMO network of 3 members (rho=0.5)"
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).member_logits, network(**inputs).member_logits)
    d, c, p, classes = 32, 3, 4, 5  # the extra cost over one ViT: 2 more input convolutions and 2 more heads
    assert he.count_parameters(network) - he.count_parameters(model) == 2 * (d * c * p * p) + 2 * (
        d * classes + classes
    )
    patches, batch = (16 // p) ** 2, 4
    extra = 2 * batch * (patches * d * c * p * p + d * classes) * 2  # multiply-adds x 2
    assert he.count_flops(network, inputs) - he.count_flops(model, inputs) == extra
    assert he.predictors.model_config(loaded).num_labels == classes  # it names the C classes
    save_predictor(network.to(torch.bfloat16), tmp_path / "bf16")  # loaded as saved, not cast into fp32
    assert next(load_predictor(tmp_path / "bf16").parameters()).dtype == torch.bfloat16


def test_images_of_other_channels_are_refused_not_read_as_m_inputs():
    network = mimo(MODELS["vit"](), members=3, seed=0).eval()  # 3-channel images: 9 channels would be 3 inputs
    channels = network.model.config.num_channels
    wrong = torch.randn(2, 3 * channels, 16, 16)
    with pytest.raises(ValueError, match=f"reads images of {channels} channel"):
        network(pixel_values=wrong)


def test_text_models_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="Text has no sensible analogue"):
        mimo(MODELS["bert"]())
