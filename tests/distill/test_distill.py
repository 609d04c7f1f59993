"""Hydra distillation (paper 001): losses against their closed forms, growth is exact, students save and reload."""

import math

import pytest
import torch
from conftest import LAYERS, MODELS, make_inputs
from tolerances import CONTRACT

import hydra_ensembles as he
from hydra_ensembles import training as ft
from hydra_ensembles.distill import MultiHeadMLP, attach_teacher, distill
from hydra_ensembles.metrics import gaussian_mixture_nll
from hydra_ensembles.predictors import DeepEnsemble, MCDropout, load_predictor, save_predictor
from hydra_ensembles.uncertainty import decompose, gaussian_mixture

# ---- classification loss (Eq. 1-4) ----


def _kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def _softmax(z, t=1.0):
    e = [math.exp(v / t) for v in z]
    return [v / sum(e) for v in e]


TEACHER = [[[2.0, 0.0, -1.0], [0.0, 1.0, 0.5]], [[-1.0, 3.0, 0.0], [1.0, 1.0, 1.0]]]  # (B=2, M=2, C=3)
STUDENT = [[[1.0, 0.5, 0.0], [0.2, 0.1, 0.0]], [[0.0, 2.0, 1.0], [-0.5, 0.5, 0.0]]]


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_per_head_kl_is_the_mean_of_the_members_kl_times_t_squared(temperature):
    loss = ft.DistillKL(temperature)(
        torch.tensor(STUDENT, dtype=torch.float64), {"teacher_outputs": torch.tensor(TEACHER, dtype=torch.float64)}
    )
    expected = [
        _kl(_softmax(TEACHER[b][m], temperature), _softmax(STUDENT[b][m], temperature))
        for b in range(2)
        for m in range(2)
    ]
    assert loss.item() == pytest.approx(sum(expected) / 4 * temperature**2, rel=1e-12)


@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_one_head_matches_the_ensemble_mean(temperature):
    student = [[row[0]] for row in STUDENT]  # (B, 1, C): the Hinton head
    loss = ft.DistillKL(temperature)(
        torch.tensor(student, dtype=torch.float64), {"teacher_outputs": torch.tensor(TEACHER, dtype=torch.float64)}
    )
    expected = []
    for b in range(2):
        members = [_softmax(TEACHER[b][m], temperature) for m in range(2)]
        mean = [(x + y) / 2 for x, y in zip(*members)]
        expected.append(_kl(mean, _softmax(student[b][0], temperature)))
    assert loss.item() == pytest.approx(sum(expected) / 2 * temperature**2, rel=1e-12)


def test_distillation_losses_refuse_bad_batches():
    with pytest.raises(ValueError, match="attach_teacher"):
        ft.DistillKL()(torch.zeros(2, 2, 3), {"labels": torch.zeros(2)})
    with pytest.raises(ValueError, match="3 heads and the teacher 2 members"):
        ft.DistillKL()(torch.zeros(2, 3, 3), {"teacher_outputs": torch.zeros(2, 2, 3)})
    with pytest.raises(ValueError, match="temperature must be > 0"):
        ft.DistillKL(0.0)


# ---- regression (Gaussian KL) ----


def test_gaussian_kl_matches_a_monte_carlo_estimate():
    g = torch.Generator().manual_seed(0)
    mean_p, log_var_p, mean_q, log_var_q = 0.3, math.log(0.5), -0.4, math.log(2.0)
    x = mean_p + math.exp(0.5 * log_var_p) * torch.randn(2_000_000, generator=g, dtype=torch.float64)
    log_p = -0.5 * (math.log(2 * math.pi) + log_var_p + (x - mean_p) ** 2 / math.exp(log_var_p))
    log_q = -0.5 * (math.log(2 * math.pi) + log_var_q + (x - mean_q) ** 2 / math.exp(log_var_q))
    samples = log_p - log_q
    monte_carlo, error = samples.mean().item(), 4 * samples.std().item() / math.sqrt(len(samples))
    closed = ft.gaussian_kl(*map(torch.tensor, (mean_p, log_var_p, mean_q, log_var_q))).item()
    assert abs(closed - monte_carlo) < error
    # the paper's printed form flips the sign of the quadratic term: it is far from the estimate
    var_p, var_q = math.exp(log_var_p), math.exp(log_var_q)
    printed = -(var_p + (mean_p - mean_q) ** 2) / (2 * var_q) + 0.5 * math.log(2 * math.pi * var_q)
    entropy_p = 0.5 * math.log(2 * math.pi * math.e * var_p)
    assert abs(printed - entropy_p - monte_carlo) > 100 * error


def test_gaussian_kl_loss_per_head_and_against_every_member():
    teacher = torch.tensor([[[0.0, 0.0], [1.0, math.log(2.0)]]])  # (B=1, M=2, 2)
    heads = torch.tensor([[[0.5, 0.1], [-0.3, 0.7]]])
    one = heads[:, :1]
    kl = lambda a, b: ft.gaussian_kl(a[0], a[1], b[0], b[1]).item()  # noqa: E731
    per_head = (kl(teacher[0, 0], heads[0, 0]) + kl(teacher[0, 1], heads[0, 1])) / 2
    against_every_member = (kl(teacher[0, 0], one[0, 0]) + kl(teacher[0, 1], one[0, 0])) / 2
    assert ft.GaussianKL()(heads, {"teacher_gaussians": teacher}).item() == pytest.approx(per_head)
    assert ft.GaussianKL()(one, {"teacher_gaussians": teacher}).item() == pytest.approx(against_every_member)
    assert per_head != pytest.approx(against_every_member)


def test_member_losses_sum_each_members_own_loss():
    logits = torch.tensor([[[2.0, 0.0], [0.0, 1.0]], [[0.5, 0.5], [1.0, -1.0]]])  # (B=2, M=2, C=2)
    labels = torch.tensor([0, 1])
    ce = lambda z, y: -math.log(math.exp(z[y]) / sum(math.exp(v) for v in z))  # noqa: E731
    own = sum(sum(ce(logits[b, m].tolist(), labels[b]) for b in range(2)) / 2 for m in range(2))
    assert ft.CrossEntropy()(logits, {"labels": labels}).item() == pytest.approx(own, rel=1e-6)
    gaussians = torch.tensor([[[0.0, 0.0], [1.0, math.log(4.0)]]])  # N(0, 1), N(1, 4); target 2
    nll = lambda mu, var: 0.5 * (math.log(2 * math.pi * var) + (2.0 - mu) ** 2 / var)  # noqa: E731
    loss = ft.GaussianNLL()(gaussians, {"labels": torch.tensor([2.0])}).item()
    assert loss == pytest.approx(nll(0.0, 1.0) + nll(1.0, 4.0), rel=1e-6)


def test_mixture_nll_equals_scipy():
    stats = pytest.importorskip("scipy.stats")
    g = torch.Generator().manual_seed(1)
    gaussians = torch.randn(20, 3, 2, generator=g, dtype=torch.float64)
    targets = torch.randn(20, generator=g, dtype=torch.float64)
    mu, sd = gaussians[..., 0].numpy(), gaussians[..., 1].exp().sqrt().numpy()
    density = stats.norm.pdf(targets.numpy()[:, None], mu, sd).mean(axis=1)
    assert gaussian_mixture_nll(gaussians, targets) == pytest.approx(-sum(map(math.log, density)) / 20, rel=1e-10)


# ---- uncertainty decomposition (Eq. 6) ----


def test_decomposition_matches_a_hand_computation():
    logits = torch.log(torch.tensor([[[0.9, 0.1], [0.1, 0.9]], [[0.7, 0.3], [0.7, 0.3]]], dtype=torch.float64))
    parts = decompose(logits)
    h = lambda p: -sum(x * math.log(x) for x in p)  # noqa: E731
    assert parts["total"].tolist() == pytest.approx([math.log(2), h([0.7, 0.3])])
    assert parts["data"].tolist() == pytest.approx([h([0.9, 0.1]), h([0.7, 0.3])])
    assert parts["model"].tolist() == pytest.approx([math.log(2) - h([0.9, 0.1]), 0.0], abs=1e-12)
    assert torch.equal(parts["model"], he.mutual_information(logits))
    gaussians = torch.tensor([[[0.0, 0.0], [2.0, math.log(3.0)]]], dtype=torch.float64)  # N(0, 1), N(2, 3)
    mixture = gaussian_mixture(gaussians)
    assert (mixture["mean"].item(), mixture["aleatoric"].item()) == pytest.approx((1.0, 2.0))
    assert (mixture["epistemic"].item(), mixture["total"].item()) == pytest.approx((1.0, 3.0))


# ---- students: growth is exact, save and reload ----


@pytest.mark.parametrize("name", ["bert", "vit", "mpnet"])
@pytest.mark.parametrize("head_layers", [0, 1, LAYERS])
def test_a_grown_transformer_student_predicts_what_its_hinton_head_did(name, head_layers):
    inputs = make_inputs(name)
    hinton = he.HydraEnsemble.fuse([MODELS[name]()])
    grown = hinton.grow(3, head_layers)
    assert grown.num_members == 3 and grown.trunk == LAYERS - head_layers
    with torch.no_grad():
        one, many = hinton(**inputs).member_logits, grown(**inputs).member_logits  # (B, 1, C), (B, 3, C)
    assert (many - one).abs().max().item() <= CONTRACT
    assert torch.allclose(he.ensemble_probs(many), he.ensemble_probs(one), atol=CONTRACT)
    # the body is stored once; each of the 2 extra heads adds one copy of the last layers and the classifier
    assert he.count_parameters(grown) == he.count_parameters(hinton) + 2 * _head_parameters(hinton, head_layers)


def _head_parameters(hinton, head_layers):
    """Parameters of the last `head_layers` layers plus the classifier side of a one-member ensemble."""
    layers = sum(p.numel() for layer in hinton.layers[len(hinton.layers) - head_layers :] for p in layer.parameters())
    return layers + sum(p.numel() for p in hinton.outer.member.parameters())


def test_a_grown_mlp_student_predicts_what_its_hinton_head_did():
    hinton = MultiHeadMLP(4, 3, body=(8,), head=(5,), heads=1, seed=3)
    grown = hinton.grow(4)
    x = torch.randn(6, 4)
    with torch.no_grad():
        assert torch.equal(grown(x).member_logits, hinton(x).member_logits.expand(6, 4, 3))


def test_training_moves_the_heads_apart_and_the_body_once(tmp_path):
    """Phase 2 through the loop on a fused transformer student: heads diverge towards their members, the body
    (one copy) is updated, and the student saves and reloads to identical outputs."""
    teacher = DeepEnsemble([_scaled(MODELS["bert"](seed=s), 20.0) for s in (1, 2, 3)])  # confident, different
    data = attach_teacher([make_inputs("bert", seed=s) for s in range(4)], teacher)
    student = he.HydraEnsemble.fuse([MODELS["bert"](seed=9)]).grow(3, head_layers=1)
    body_before = {k: v.clone() for k, v in student.layers[0].state_dict().items()}
    loss = ft.DistillKL()
    before = sum(loss(student(**_inputs(b)).member_logits, b).item() for b in data)
    ft.train(student, data, ft.TEXT_RECIPE.with_(epochs=25, lr=3e-3, patience=None), loss=loss, progress=False)
    with torch.no_grad():
        after = sum(loss(student(**_inputs(b)).member_logits, b).item() for b in data)
        logits = student(**_inputs(data[0])).member_logits
    assert after < 0.5 * before
    # each head moved towards its own member: KL(member m || head m) below KL(member m' || head m), m' != m
    teacher_logits = torch.cat([b["teacher_outputs"] for b in data])  # (N, 3, C)
    with torch.no_grad():
        heads = torch.cat([student(**_inputs(b)).member_logits for b in data])  # (N, 3, C)
    log_p, log_q = teacher_logits.log_softmax(-1)[:, :, None], heads.log_softmax(-1)[:, None]  # (N, m', 1|m, C)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean(0)  # (member m', head m)
    assert all(kl[m, m] < kl[other, m] for m in range(3) for other in range(3) if other != m)
    # the body was trained, and is still one copy run once
    assert any(not torch.equal(v, body_before[k]) for k, v in student.layers[0].state_dict().items())
    assert all(p.shape[0] == 1 for p in student.layers[0].parameters()) and student.trunk == LAYERS - 1
    saved = save_predictor(student, tmp_path / "student")
    reloaded = load_predictor(saved)
    with torch.no_grad():
        assert torch.equal(reloaded(**_inputs(data[0])).member_logits, logits)


def test_a_fused_image_student_trains_with_its_embeddings_frozen_as_the_image_recipe_asks(tmp_path):
    """DINOv2's recipe freezes the embeddings; a fused student takes the same recipe (issue 44: it was refused)."""
    teacher = DeepEnsemble([MODELS["dinov2"](seed=s) for s in (1, 2)])
    data = attach_teacher([make_inputs("dinov2", seed=s) for s in range(2)], teacher)
    student = he.HydraEnsemble.fuse([MODELS["dinov2"](seed=9)])
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    config = ft.IMAGE_RECIPE.with_(epochs=2, lr=0.05, warmup=0.0, freeze_embeddings=True, patience=None)
    hydra = distill(student, data, phase1=config, phase2=config, head_layers=1, progress=False).hydra
    moved = {n for n, p in student.named_parameters() if not torch.equal(p, before[n])}
    embeddings = {n for n in before if student.locate(n)[0] == "embeddings"}
    assert embeddings and not moved & embeddings and moved  # phase 1 trained the rest, never the embeddings
    grown = {n: p for n, p in hydra.named_parameters() if hydra.locate(n)[0] == "embeddings"}
    assert grown.keys() == embeddings and all(torch.equal(p, before[n]) for n, p in grown.items())  # nor phase 2


def _scaled(model, factor):
    with torch.no_grad():
        model.classifier.weight.mul_(factor)
    return model


def _inputs(batch):
    return {k: v for k, v in batch.items() if k not in ("labels", "teacher_outputs")}


# ---- the two phases end to end (MLP), and saving ----


def _blobs(n, seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (n,), generator=g)
    centres = torch.tensor([[0.0, 2.0], [2.0, -1.0], [-2.0, -1.0]])
    return centres[labels] + 1.2 * torch.randn(n, 2, generator=g), labels


def _batches(x, y, size=32):
    return [{"inputs": x[i : i + size], "labels": y[i : i + size]} for i in range(0, len(x), size)]


def test_hydra_keeps_the_members_disagreement_that_knowledge_distillation_loses(tmp_path):
    x, y = _blobs(384, 0)
    ensemble = MultiHeadMLP(2, 3, body=(), head=(32,), heads=5, seed=0)  # five independent MLPs
    ft.train(
        ensemble, _batches(x, y), ft.TrainConfig(epochs=30, lr=1e-2, warmup=0.0), loss=ft.CrossEntropy(), progress=False
    )
    # far from every class, members disagree; half of these points join the transfer set (so the heads see the
    # disagreement they are to learn), the other half is where it is measured
    far = torch.randn(200, 2) * 2 + torch.tensor([8.0, 8.0])
    transfer = attach_teacher(
        _batches(torch.cat([x, far[:100]]), torch.cat([y, torch.zeros(100, dtype=torch.long)])), ensemble
    )
    config = ft.TrainConfig(epochs=40, lr=1e-2, warmup=0.0)
    student = MultiHeadMLP(2, 3, body=(32,), head=(16,), heads=1, seed=1)
    result = distill(student, transfer, phase1=config, phase2=config, temperature=2.0, progress=False)
    with torch.no_grad():
        mu = {
            k: he.mutual_information(m(far[100:]).member_logits)
            for k, m in [("teacher", ensemble), ("kd", result.kd), ("hydra", result.hydra)]
        }
    assert result.kd.num_members == 1 and result.hydra.num_members == 5
    gap_kd, gap_hydra = ((mu[k] - mu["teacher"]).abs().mean() for k in ("kd", "hydra"))
    assert mu["teacher"].mean() > 0.01 and gap_hydra < 0.25 * gap_kd  # measured: KD 0.031 (all of it), Hydra 0.0014
    reloaded = load_predictor(save_predictor(result.hydra, tmp_path / "hydra"))
    with torch.no_grad():
        assert torch.equal(reloaded(far).member_logits, result.hydra(far).member_logits)


def test_distill_refuses_batches_without_teacher_outputs():
    x, y = _blobs(8, 0)
    with pytest.raises(ValueError, match="attach_teacher"):
        distill(MultiHeadMLP(2, 3), _batches(x, y), phase1=ft.TrainConfig(), phase2=ft.TrainConfig(), progress=False)
    one_member = attach_teacher(_batches(x, y), MultiHeadMLP(2, 3, heads=1, seed=3))
    with pytest.raises(ValueError, match="the teacher has one member"):
        distill(MultiHeadMLP(2, 3), one_member, phase1=ft.TrainConfig(), phase2=ft.TrainConfig(), progress=False)


def test_regression_distils_gaussian_heads_and_keeps_the_epistemic_spread():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(256, 1, generator=g) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + (0.1 + 0.2 * x[:, 0].abs()) * torch.randn(256, generator=g)  # heteroscedastic
    data = _batches(x, y)
    ensemble = MultiHeadMLP(1, 2, body=(), head=(32,), heads=4, regression=True, seed=0)
    ft.train(ensemble, data, ft.TrainConfig(epochs=60, lr=1e-2, warmup=0.0), loss=ft.GaussianNLL(), progress=False)
    transfer = attach_teacher(data, ensemble)
    assert transfer[0]["teacher_gaussians"].shape == (32, 4, 2) and "teacher_outputs" not in transfer[0]
    config = ft.TrainConfig(epochs=60, lr=1e-2, warmup=0.0)
    # (B, M, 2) alone does not tell Gaussians from two classes: each kind of student refuses the other's teacher
    two_classes = MultiHeadMLP(1, 2, body=(8,), heads=1, seed=1)
    with pytest.raises(
        ValueError, match=r"its teacher is a regressor \(member Gaussians\) and this student a classifier"
    ):
        distill(two_classes, transfer, phase1=config, phase2=config, progress=False)
    classifier_teacher = attach_teacher(data[:1], MultiHeadMLP(1, 2, heads=3, seed=2))
    with pytest.raises(ValueError, match=r"teacher is a classifier \(member logits\) and this student a regressor"):
        distill(MultiHeadMLP(1, 2, heads=1, regression=True), classifier_teacher, phase1=config, phase2=config)
    with pytest.raises(ValueError, match="no temperature"):
        distill(MultiHeadMLP(1, 2, heads=1, regression=True), transfer, phase1=config, phase2=config, temperature=2)
    student = MultiHeadMLP(1, 2, body=(32,), head=(8,), heads=1, regression=True, seed=1)
    result = distill(student, transfer, phase1=config, phase2=config, val_loader=data[:2], progress=False)
    outside = torch.linspace(2.5, 4.0, 50)[:, None]  # beyond the data: the members' means spread apart
    with torch.no_grad():
        spread = {k: gaussian_mixture(m(outside).member_gaussians)["epistemic"].mean() for k, m in
                  [("teacher", ensemble), ("kd", result.kd), ("hydra", result.hydra)]}  # fmt: skip
        test_nll = {
            k: gaussian_mixture_nll(m(x).member_gaussians, y) for k, m in [("kd", result.kd), ("hydra", result.hydra)]
        }
    assert spread["kd"] == 0 and spread["teacher"] > 0 and spread["hydra"] > 0.1 * spread["teacher"]
    assert abs(test_nll["hydra"] - test_nll["kd"]) < 0.5  # both fit the data; the numbers are the benchmark's
    assert result.hydra.kept_epoch >= 1 and "val_nll" in result.hydra.training_history[0]
    with pytest.raises(ValueError, match="no accuracy to monitor"):
        ft.train(student, data, config.with_(monitor="acc"), loss=ft.GaussianKL(), val_loader=data[:2], progress=False)


def test_distill_checks_what_it_can_before_training(tmp_path):
    x, y = _blobs(64, 0)
    teacher = MultiHeadMLP(2, 3, body=(), head=(8,), heads=3, seed=0)
    transfer = attach_teacher(_batches(x, y), teacher)
    config = ft.TrainConfig(epochs=1)
    with pytest.raises(ValueError, match="teacher's members output 3 values per input but the student outputs 4"):
        distill(MultiHeadMLP(2, 4), transfer, phase1=config, phase2=config, progress=False)
    with pytest.raises(ValueError, match="head_layers is for transformers"):
        distill(MultiHeadMLP(2, 3), transfer, phase1=config, phase2=config, head_layers=1, progress=False)
    with pytest.raises(ValueError, match="head_layers must be in 0..3"):
        batch = {"teacher_outputs": torch.zeros(4, 2, 3)} | make_inputs("bert")
        distill(he.HydraEnsemble.fuse([MODELS["bert"]()]), [batch], phase1=config, phase2=config, head_layers=4,
                progress=False)  # fmt: skip
    distill(MultiHeadMLP(2, 3), transfer, phase1=config, phase2=config, checkpoint_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="belong to another distillation"):
        distill(MultiHeadMLP(2, 3), transfer, phase1=config, phase2=config, temperature=2.0, checkpoint_dir=tmp_path,
                progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="a MultiHeadMLP has none"):
        ft.train(MultiHeadMLP(2, 3), _batches(x, y), config.with_(freeze_embeddings=True), loss=ft.CrossEntropy(),
                 progress=False)  # fmt: skip


def test_growing_and_saving_keep_the_students_dtype_and_what_was_frozen(tmp_path):
    hinton = MultiHeadMLP(2, 3, heads=1).double()
    assert all(p.dtype == torch.float64 for p in hinton.grow(3).parameters())
    reloaded = load_predictor(save_predictor(hinton.grow(3), tmp_path / "f64"))  # was built float32, cast into
    assert all(p.dtype == torch.float64 for p in reloaded.parameters())
    x = torch.randn(4, 2, dtype=torch.float64)
    assert torch.equal(reloaded(x).member_logits, hinton.grow(3).eval()(x).member_logits)
    hinton.body.requires_grad_(False)  # as the loop's error message tells a user to freeze the body
    grown = hinton.grow(3)
    assert not any(p.requires_grad for p in grown.body.parameters())
    assert all(p.requires_grad for p in [*grown.head_weights, *grown.head_biases])
    fused = he.HydraEnsemble.fuse([MODELS["bert"]()])
    fused.layers[0].requires_grad_(False)
    grown = fused.grow(3, 1)
    assert not any(p.requires_grad for p in grown.layers[0].parameters())
    assert all(p.requires_grad for p in grown.layers[-1].parameters())


def test_distill_refuses_what_would_teach_a_head_the_wrong_target():
    """A crop is taught the whole image's teacher output, and MC dropout's m-th sample is a new mask at every
    call: both are refused, naming the fix; a teacher of fixed members passes the same check."""
    model = MODELS["bert"]()
    batches = [make_inputs("bert") | {"labels": torch.zeros(4, dtype=torch.long)}]
    with pytest.raises(ValueError, match="members change from call to call"):
        attach_teacher(batches, MCDropout(model, samples=3))
    transfer = attach_teacher(batches, DeepEnsemble([model, MODELS["bert"]()]))
    config = ft.TrainConfig(epochs=1)
    with pytest.raises(ValueError, match="cannot augment its transfer batches .*augment=None"):
        distill(he.HydraEnsemble.fuse([model]), transfer, phase1=config, phase2=config.with_(augment="crop_flip"),
                progress=False)  # fmt: skip


def test_a_one_shot_validation_loader_serves_both_phases():
    """val_loader was handed raw to both phases: a generator was spent by phase 1, and phase 2 failed with "the
    validation loader is empty" after phase 1 had trained."""
    x, y = _blobs(64, 1)
    teacher = MultiHeadMLP(2, 3, body=(), head=(8,), heads=3, seed=0)
    batches = attach_teacher(_batches(x, y), teacher)
    config = ft.TrainConfig(epochs=1, lr=1e-2, warmup=0.0)
    student = MultiHeadMLP(2, 3, body=(8,), head=(), heads=1, seed=1)
    result = distill(student, batches, phase1=config, phase2=config, val_loader=(b for b in batches), progress=False)
    assert result.hydra.num_members == 3
