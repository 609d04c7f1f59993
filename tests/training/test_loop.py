"""Fine-tuning recipes: seeded, resumable to the same weights, partial unfreezing, best epoch on validation."""

import pytest
import torch
import transformers as T
from conftest import IMAGE, MODELS, SIZES, killed_at_step, make_inputs

from hydra_ensembles import training as ft
from hydra_ensembles.distill import MultiHeadMLP, attach_teacher
from hydra_ensembles.training.loop import _remember
from hydra_ensembles.training.recipes import lr_factor


def _data(name="bert", batches=3, seed=5):
    classes = 3 if name == "bert" else 5
    return [make_inputs(name, seed=seed + i) | {"labels": torch.arange(4) % classes} for i in range(batches)]


CONFIG = ft.TEXT_RECIPE.with_(epochs=3, lr=1e-3, patience=None)


def test_a_killed_run_resumes_to_the_same_weights(tmp_path):
    uninterrupted = ft.finetune(MODELS["bert"](), _data(), CONFIG, progress=False).state_dict()
    with killed_at_step(8):  # 3 steps per epoch: the 2nd step of epoch 3
        ft.finetune(MODELS["bert"](), _data(), CONFIG, checkpoint_dir=tmp_path, progress=False)
    assert torch.load(tmp_path / ft.CHECKPOINT, weights_only=False)["state"]["epoch"] == 2
    model, steps = MODELS["bert"](), []
    model.register_forward_hook(lambda module, args, output: steps.append(module.training))
    resumed = ft.finetune(model, _data(), CONFIG, checkpoint_dir=tmp_path, progress=False).state_dict()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)  # same operations: bit-identical
    # and it did resume: a seeded restart from epoch 1 would end with the same weights, in 9 steps, not 3
    assert steps.count(True) == 3
    with pytest.raises(ValueError, match="different config"):
        ft.finetune(MODELS["bert"](), _data(), CONFIG.with_(lr=2e-3), checkpoint_dir=tmp_path, progress=False)
    other = MODELS["bert"]()
    with torch.no_grad():
        next(other.parameters()).add_(1e-3)  # same shapes, other weights: would silently continue the first run
    with pytest.raises(ValueError, match="written for another starting model .*Delete it"):
        ft.finetune(other, _data(), CONFIG, checkpoint_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="written for another training or validation data"):
        ft.finetune(MODELS["bert"](), _data(seed=9), CONFIG, checkpoint_dir=tmp_path, progress=False)


@pytest.mark.parametrize("augment", [None, "crop_flip"])
def test_a_run_killed_within_an_epoch_resumes_at_its_step_to_the_same_weights(tmp_path, augment):
    """With a checkpoint after every step (checkpoint_every=0), a run killed in the middle of epoch 3 resumes at
    the step it reached, not the epoch's start: its batch order, augmentation draws and dropout masks as an
    uninterrupted run's (dropout 0.1 in both models), so it ends bit-identical having run only the steps left."""
    if augment is None:
        build, data, config = MODELS["bert"], _data(), CONFIG
    else:

        def build():
            torch.manual_seed(0)
            return T.ViTForImageClassification(T.ViTConfig(**IMAGE, **SIZES, num_labels=5, hidden_dropout_prob=0.1))

        data, config = _data("vit"), CONFIG.with_(augment=augment)
    loss = ft.losses.CrossEntropy()
    model = build()
    assert model.config.hidden_dropout_prob > 0  # or the dropout streams would go untested
    uninterrupted = ft.train(model, data, config, loss=loss, progress=False)
    with killed_at_step(8):  # 3 steps per epoch: the 2nd step of epoch 3, after a checkpoint at its 1st
        ft.train(build(), data, config, loss=loss, checkpoint_dir=tmp_path, checkpoint_every=0, progress=False)
    saved = torch.load(tmp_path / ft.CHECKPOINT, weights_only=False)["state"]
    assert saved["epoch"] == 2 and saved["within"]["step"] == 1
    model, steps = build(), []
    model.register_forward_hook(lambda module, args, output: steps.append(module.training))
    resumed = ft.train(model, data, config, loss=loss, checkpoint_dir=tmp_path, progress=False)
    assert steps.count(True) == 2  # the steps left of epoch 3
    assert all(torch.equal(a, b) for a, b in zip(resumed.state_dict().values(), uninterrupted.state_dict().values()))
    assert resumed.training_history == uninterrupted.training_history  # epoch 3's mean loss counts its 1st step


def test_a_checkpoint_is_refused_for_another_set_of_trainable_parameters_and_a_killed_run_keeps_its_mode(tmp_path):
    """What trains is part of a checkpoint's identity (the optimiser's state is per parameter: resumed with another
    parameter frozen, Adam's moments would land on other tensors), checked before anything is loaded; finetune
    passes checkpoint_every on; a killed run leaves the model in the mode it was given in."""
    model = MODELS["bert"]()
    with killed_at_step(5):  # epoch 2's 2nd step: a checkpoint within the epoch, finetune passing checkpoint_every on
        ft.finetune(model, _data(), CONFIG, checkpoint_dir=tmp_path, checkpoint_every=0, progress=False)
    assert not model.training  # given in eval mode, left in it
    assert torch.load(tmp_path / ft.CHECKPOINT, weights_only=False)["state"]["within"]["step"] == 1
    other = MODELS["bert"]()
    other.bert.encoder.layer[0].attention.self.query.weight.requires_grad_(False)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match="another set of trainable parameters"):
        ft.finetune(other, _data(), CONFIG, checkpoint_dir=tmp_path, progress=False)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())


def test_a_checkpoint_within_an_epoch_resumed_on_another_kind_of_device_says_its_dropout_differs(tmp_path):
    with killed_at_step(5):
        ft.finetune(MODELS["bert"](), _data(), CONFIG, checkpoint_dir=tmp_path, checkpoint_every=0, progress=False)
    payload = torch.load(tmp_path / ft.CHECKPOINT, weights_only=False)
    payload["state"]["within"]["streams"]["device"] = "cuda"  # as if written on a GPU
    torch.save(payload, tmp_path / ft.CHECKPOINT)
    with pytest.warns(RuntimeWarning, match="written within an epoch on cuda and resumes on cpu: the dropout masks"):
        ft.finetune(MODELS["bert"](), _data(), CONFIG, checkpoint_dir=tmp_path, progress=False)


@pytest.mark.parametrize(
    "field, value",
    [("lr", 0.0), ("warmup", 1.5), ("min_lr", -0.1), ("weight_decay", -1e-4), ("label_smoothing", 1.0),
     ("min_delta", -1e-3), ("clip", 0.0), ("train_last", -1)],
)  # fmt: skip
def test_train_config_refuses_values_that_would_train_silently_wrong(field, value):
    with pytest.raises(ValueError, match=f"{field} must be"):
        CONFIG.with_(**{field: value})


def test_feature_mse_compares_float32_features_under_bf16():
    """Features that arrive in bfloat16 (a forward under bf16 autocast without a final float32 norm) are compared
    in float32, as the other losses compute, not as bf16-rounded differences."""
    teacher, batch = MODELS["bert"](), make_inputs("bert")
    forward = lambda model, inputs: ft.last_hidden_states(model, inputs).bfloat16()  # noqa: E731
    features = forward(MODELS["bert"](seed=1), batch).detach()
    value = ft.losses.FeatureMSE(teacher, forward)(features, batch)
    difference = (features.float() - forward(teacher, batch).float()) ** 2  # float32 arithmetic on the bf16 values
    mask = batch["attention_mask"][:, 1:].float()
    rest = (difference[:, 1:].mean(-1) * mask).sum(1) / mask.sum(1)
    assert value.dtype == torch.float32
    assert torch.allclose(value, (difference[:, 0].mean(-1) + rest).mean(), rtol=1e-6, atol=0)


def test_adamw_betas_come_from_the_config_and_key_it_only_when_changed():
    """AMP_RECOVERY uses paper 002's Table 8 betas; recipes at AdamW's default keep their cache keys."""
    parameters = [torch.nn.Parameter(torch.zeros(2, 2))]
    for config in (CONFIG, ft.AMP_RECOVERY):
        optimizer = ft.recipes.OPTIMIZERS["adamw"](parameters, config)
        assert optimizer.param_groups[0]["betas"] == tuple(config.betas)
    assert ft.AMP_RECOVERY.betas == (0.9, 0.95) and ft.AMP_RECOVERY.weight_decay == 0.0
    assert "betas" not in CONFIG.key() and "betas" not in repr(CONFIG)
    assert ft.AMP_RECOVERY.key()["betas"] == (0.9, 0.95)


def test_bf16_mixed_precision_runs_the_forward_in_bf16_and_keeps_float32_weights():
    model, seen = MODELS["bert"](), []
    model.bert.encoder.layer[0].attention.self.query.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    config = CONFIG.with_(precision="bf16", lr=1e-2)
    ft.finetune(model, _data(), config, progress=False)
    assert seen and all(dtype == torch.bfloat16 for dtype in seen)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    losses = [h["loss"] for h in model.training_history]
    assert losses[-1] < losses[0]
    seen.clear()
    ft.validate(model, _data(seed=20))  # validation stays float32
    assert seen and all(dtype == torch.float32 for dtype in seen)
    # a model trained before the field existed (fp32) keeps its key; bf16 gets another
    assert "precision" not in CONFIG.key() and config.key()["precision"] == "bf16"
    assert "precision" not in repr(CONFIG) and "precision='bf16'" in repr(config)
    with pytest.raises(ValueError, match="precision must be"):
        CONFIG.with_(precision="fp16")


def test_train_last_updates_only_the_last_blocks_and_the_head():
    model = MODELS["vit"]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ft.finetune(model, _data("vit"), ft.IMAGE_RECIPE.with_(epochs=1, train_last=1), progress=False)
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all(k.startswith(("vit.layers.2.", "vit.layernorm.", "classifier.")) for k in changed)
    assert any(k.startswith("classifier.") for k in changed) and any(k.startswith("vit.layers.2.") for k in changed)


def test_validation_keeps_the_epoch_best_on_the_monitored_score():
    model = MODELS["bert"]()
    config = CONFIG.with_(epochs=6, patience=1, lr=5e-2, monitor="nll")
    ft.finetune(model, _data(), config, val_loader=_data(seed=20), progress=False)
    history = model.training_history
    assert 1 <= len(history) <= 6 and all("val_acc" in h and "val_nll" in h for h in history)
    best = min(h["val_nll"] for h in history)
    assert ft.validate(model, _data(seed=20))["val_nll"] == best  # the kept epoch's weights, evaluated again
    assert model.kept_epoch == next(h["epoch"] for h in history if h["val_nll"] == best)
    by_accuracy = MODELS["bert"]()
    config = CONFIG.with_(epochs=6, patience=1, lr=5e-2, monitor="acc")
    ft.finetune(by_accuracy, _data(), config, val_loader=_data(seed=20), progress=False)
    history = by_accuracy.training_history
    best = max(h["val_acc"] for h in history)
    kept = next(h for h in history if h["val_acc"] == best)  # the first epoch that reached it: a later tie is no gain
    again = ft.validate(by_accuracy, _data(seed=20))
    assert by_accuracy.kept_epoch == kept["epoch"] and again["val_acc"] == best
    assert again["val_nll"] == kept["val_nll"]  # that epoch's weights (here epochs 2 and 3 tie on accuracy, not NLL)
    assert ft.TEXT_RECIPE.monitor == "acc_nll"  # the paper's accuracy (§C.2), ties to the lower NLL


def test_patience_stops_and_a_resumed_run_keeps_its_best_epoch_and_stale_count(tmp_path, monkeypatch):
    """Validation scores that only fall after epoch 1: patience 2 stops after epoch 3 and keeps epoch 1. Killed
    in epoch 3 and resumed, the run restores its best weights and stale count: same history, same weights."""
    scores = iter([0.9, 0.8, 0.7, 0.6, 0.5, 0.4] * 3)
    monkeypatch.setattr(ft.loop, "validate", lambda model, batches: {"val_acc": next(scores), "val_nll": 1.0})
    config = CONFIG.with_(epochs=6, patience=2, monitor="acc")
    straight = ft.finetune(MODELS["bert"](), _data(), config, val_loader=_data(seed=20), progress=False)
    assert [h["epoch"] for h in straight.training_history] == [1, 2, 3] and straight.kept_epoch == 1
    scores = iter([0.9, 0.8, 0.7, 0.6])
    with killed_at_step(8):  # 3 steps per epoch: in epoch 3, after epoch 2's checkpoint (stale 1)
        ft.finetune(
            MODELS["bert"](), _data(), config, val_loader=_data(seed=20), checkpoint_dir=tmp_path, progress=False
        )
    scores = iter([0.7, 0.6])  # what epoch 3 and after see
    resumed = ft.finetune(
        MODELS["bert"](), _data(), config, val_loader=_data(seed=20), checkpoint_dir=tmp_path, progress=False
    )
    assert resumed.training_history == straight.training_history and resumed.kept_epoch == 1
    assert all(torch.equal(a, b) for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()))


def test_a_checkpoint_is_refused_for_another_split_or_loss_setting(tmp_path):
    """The data digest covers training and validation batches together: the split between them and the loss's
    own settings (label smoothing) are recorded too, or a checkpoint trained on today's validation data resumes."""
    data = _data(batches=3)
    with killed_at_step(5):
        ft.train(MODELS["bert"](), data, CONFIG, loss=ft.losses.CrossEntropy(), checkpoint_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="split of the data into training and validation"):
        ft.train(
            MODELS["bert"](), data[:2], CONFIG, loss=ft.losses.CrossEntropy(), val_loader=data[2:],
            checkpoint_dir=tmp_path,
        )  # fmt: skip
    with pytest.raises(ValueError, match="loss setting"):
        ft.train(MODELS["bert"](), data, CONFIG, loss=ft.losses.CrossEntropy(0.2), checkpoint_dir=tmp_path)


def test_a_checkpoint_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file: give a folder"):
        ft.finetune(MODELS["bert"](), _data(), CONFIG, checkpoint_dir=tmp_path / "file", progress=False)


def test_unlabelled_validation_data_is_refused_before_training():
    model, steps = MODELS["bert"](), []
    model.register_forward_hook(lambda module, args, output: steps.append(module.training))
    unlabelled = [{k: v for k, v in batch.items() if k != "labels"} for batch in _data(seed=20)]
    with pytest.raises(ValueError, match="validation loader has batches without 'labels'"):
        ft.finetune(model, _data(), CONFIG, val_loader=unlabelled, progress=False)
    assert not steps


def test_what_a_config_freezes_is_trainable_again_after_the_call():
    model = MODELS["bert"]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ft.finetune(model, _data(), CONFIG.with_(epochs=1, train_last=1), progress=False)
    embeddings = "bert.embeddings.word_embeddings.weight"
    assert torch.equal(model.state_dict()[embeddings], before[embeddings])  # frozen during the call
    assert all(p.requires_grad for p in model.parameters())
    ft.finetune(model, _data(), CONFIG.with_(epochs=1), progress=False)  # a later call trains everything
    assert not torch.equal(model.state_dict()[embeddings], before[embeddings])


def _kept(history, monitor):
    """Replays the loop's choice of the kept epoch over a validation history [(acc, nll), ...]."""
    config, state = ft.TEXT_RECIPE.with_(monitor=monitor), {"best_score": -float("inf"), "best_epoch": None, "stale": 0}
    for epoch, (acc, nll) in enumerate(history, 1):
        _remember({"epoch": epoch, "val_acc": acc, "val_nll": nll}, state, config)
    return state["best_epoch"]


def test_accuracy_ties_go_to_the_lower_nll_under_acc_nll():
    bbc_seed0 = [(0.9917, 0.318), (0.9917, 0.061), (0.9833, 0.069)]  # what MiniLM on BBC did (recipes.py)
    assert _kept(bbc_seed0, "acc") == 1  # the paper's rule alone: the first, least-trained epoch
    assert _kept(bbc_seed0, "acc_nll") == 2
    assert _kept(bbc_seed0, "nll") == 2
    rising = [(0.90, 0.20), (0.95, 0.30), (0.95, 0.3003), (0.94, 0.10)]
    assert _kept(rising, "acc_nll") == 2  # accuracy first; an NLL gain under min_delta is no gain; lower acc loses
    drifting = [(0.9000, 0.50), (0.8996, 0.40), (0.8992, 0.30), (0.8988, 0.20), (0.8984, 0.10)]
    assert _kept(drifting, "acc_nll") == 2  # a tie with the best (0.9000) only within min_delta of it, not of 2's
    with pytest.raises(ValueError, match="monitor must be one of"):
        ft.TEXT_RECIPE.with_(monitor="loss")


def test_schedules():
    warm_linear = lr_factor(ft.TrainConfig(warmup=0.1, schedule="linear"), 100)
    assert warm_linear(0) == pytest.approx(0.1) and warm_linear(9) == 1.0 and warm_linear(55) == pytest.approx(0.5)
    cosine = lr_factor(ft.TrainConfig(warmup=0.0, schedule="cosine", min_lr=0.1), 100)
    import math

    assert cosine(1) == 1.0  # one warm-up step at least, then cosine from the top
    assert cosine(50) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 49 / 99)))
    assert cosine(100) == pytest.approx(0.1)


def test_bad_inputs():
    with pytest.raises(ValueError, match="training loader is empty"):
        ft.finetune(MODELS["bert"](), [], CONFIG, progress=False)
    with pytest.raises(ValueError, match="need 'labels'"):
        ft.finetune(MODELS["bert"](), [make_inputs("bert")], CONFIG, progress=False)
    with pytest.raises(ValueError, match="no classifier"):
        ft.finetune(MODELS["bert_encoder"](), _data(), CONFIG, progress=False)
    with pytest.raises(ValueError, match="optimizer must be"):
        ft.finetune(MODELS["bert"](), _data(), CONFIG.with_(optimizer="adam"), progress=False)
    with pytest.raises(ValueError, match="patience must be None .* or >= 1"):
        CONFIG.with_(patience=0)  # would stop before the first epoch
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        CONFIG.with_(epochs=0)  # an empty history, which callers read
    regressor = MultiHeadMLP(1, 2, heads=1, regression=True)
    gaussian = [{"inputs": torch.randn(4, 1), "labels": torch.randn(4)}]
    with pytest.raises(ValueError, match="no accuracy to monitor .monitor='acc_nll'"):
        ft.train(regressor, gaussian, CONFIG, loss=ft.GaussianNLL(), val_loader=gaussian, progress=False)


def test_the_same_loop_distils_a_student_from_a_frozen_teacher():
    """A second use of the loop: a student trained only against a frozen teacher's outputs, with a KL loss."""
    teacher, student = MODELS["bert"](seed=1), MODELS["bert"](seed=2)
    with torch.no_grad():  # a confident teacher (a random tiny model's logits are all near zero)
        teacher.classifier.weight.mul_(100.0)
    teacher_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    no_labels = [{k: v for k, v in batch.items() if k != "labels"} for batch in _data(batches=4)]
    data = attach_teacher(no_labels, teacher)  # teacher_outputs (B, 1, C): one teacher, computed once

    def gap() -> float:  # KL(teacher || student) on the transfer inputs, at temperature 1
        kl = ft.DistillKL()
        with torch.no_grad():
            return sum(kl(student(**{k: batch[k] for k in no_labels[0]}).logits, batch) for batch in data).item()

    before = gap()
    ft.train(student, data, CONFIG.with_(epochs=40, lr=3e-3), loss=ft.DistillKL(temperature=2.0), progress=False)
    assert gap() < 0.2 * before  # the student moved onto the teacher
    assert all(torch.equal(v, teacher_before[k]) for k, v in teacher.state_dict().items())  # frozen
    assert len(student.training_history) == 40 and student.kept_epoch == 40


def test_a_diverged_epoch_never_counts_as_the_best_and_patience_ends_the_run(monkeypatch):
    """Validating a model whose outputs hold NaN raised (the NLL refuses NaN probabilities): the run crashed with
    the diverged weights, and a rerun from the last checkpoint crashed at the same epoch again. It scores NaN now,
    which never improves: patience stops the run and the best epoch's weights are kept."""
    real, epochs = ft.loop.validate, []

    def diverging(model, batches):  # from epoch 2 on, the weights are those of a diverged step
        epochs.append(len(epochs) + 1)
        if len(epochs) >= 2:
            with torch.no_grad():
                model.classifier.weight.fill_(float("nan"))
        return real(model, batches)

    monkeypatch.setattr(ft.loop, "validate", diverging)
    model = MODELS["bert"]()
    ft.finetune(model, _data(), CONFIG.with_(epochs=6, patience=2, monitor="acc"), val_loader=_data(seed=20),
                progress=False)  # fmt: skip
    history = model.training_history
    assert [h["epoch"] for h in history] == [1, 2, 3] and model.kept_epoch == 1
    assert all(h["val_acc"] != h["val_acc"] for h in history[1:])  # NaN: no number for a diverged epoch
    assert torch.isfinite(model.classifier.weight).all()  # the best epoch's weights, not the diverged ones
    nan_model = MODELS["bert"]()
    with torch.no_grad():
        nan_model.classifier.weight.fill_(float("nan"))
    said = real(nan_model, _data(seed=20))
    assert said.keys() == {"val_acc", "val_nll"} and all(v != v for v in said.values())
    epochs.append(0)  # diverged from the first epoch: no weights worth returning, and the message says what to do
    with pytest.raises(ValueError, match="every validated epoch diverged .non-finite outputs in all 2.*lower learning"):
        ft.finetune(MODELS["bert"](), _data(), CONFIG.with_(epochs=6, patience=2), val_loader=_data(seed=20),
                    progress=False)  # fmt: skip


def test_losses_refuse_labels_and_teachers_that_would_broadcast():
    """Labels (B, 1) against member outputs (B, M, ...) broadcast into every example against every label, and a
    teacher of another rank or batch into a loss of the wrong pairs: each is refused, naming the shapes."""
    labels = torch.tensor([0.5, 1.0, -1.0, 2.0])
    with pytest.raises(ValueError, match=r"'labels' of shape \(B,\).*got \(4, 1\)"):
        ft.GaussianNLL()(torch.randn(4, 3, 2), {"labels": labels[:, None]})
    with pytest.raises(ValueError, match=r"member Gaussians \(B, M, 2\)"):
        ft.GaussianNLL()(torch.randn(4, 2), {"labels": labels})
    with pytest.raises(ValueError, match=r"'labels' of shape \(B,\).*got \(4, 1\)"):
        ft.CrossEntropy()(torch.randn(4, 3, 5), {"labels": torch.zeros(4, 1, dtype=torch.long)})
    with pytest.raises(ValueError, match=r"one per example .*got \(3,\)"):
        ft.CrossEntropy()(torch.randn(4, 5), {"labels": torch.zeros(3, dtype=torch.long)})
    with pytest.raises(ValueError, match=r"same B and D, got \(4, 1, 5\) and \(4, 5\)"):
        ft.DistillKL()(torch.randn(4, 5), {"teacher_outputs": torch.randn(4, 5)})  # a teacher without members
    with pytest.raises(ValueError, match=r"same B and D"):
        ft.DistillKL()(torch.randn(4, 3, 5), {"teacher_outputs": torch.randn(2, 3, 5)})
    one_off = r"cross-entropy needs integer class ids in \[0, 5\) as labels.*labels 1..C are one off"
    with pytest.raises(ValueError, match=one_off):
        ft.CrossEntropy()(torch.randn(4, 3, 5), {"labels": torch.tensor([1, 2, 3, 5])})  # torch: "out of bounds"
    with pytest.raises(ValueError, match=r"label -100 .cross-entropy's ignore index.*drop the unlabelled ones"):
        ft.CrossEntropy()(torch.randn(4, 5), {"labels": torch.tensor([1, -100, 3, 0])})
    right = ft.GaussianNLL()(torch.zeros(4, 3, 2), {"labels": labels})  # the defined value still comes out
    assert right.item() == pytest.approx(3 * 0.5 * (torch.log(torch.tensor(2 * torch.pi)) + labels**2).mean().item())


def test_a_rank_takes_its_rows_of_every_per_example_input_and_settings_whole(monkeypatch):
    """Under torchrun each rank takes every world-th row; a 0-d setting (ViT's interpolate_pos_encoding) has no
    rows and goes to every rank whole."""
    from hydra_ensembles.training import loop

    monkeypatch.setattr(loop, "is_distributed", lambda: True)
    monkeypatch.setattr(loop, "world_size", lambda: 2)
    monkeypatch.setattr(loop, "rank", lambda: 1)
    flag = torch.tensor(False)
    batch = {"pixel_values": torch.arange(5.0), "interpolate_pos_encoding": flag, "labels": torch.arange(5)}
    share, mine = loop._my_rows(batch)
    assert share == pytest.approx(2 * 2 / 5)
    assert mine["pixel_values"].tolist() == [1.0, 3.0] and mine["labels"].tolist() == [1, 3]
    assert mine["interpolate_pos_encoding"] is batch["interpolate_pos_encoding"]
