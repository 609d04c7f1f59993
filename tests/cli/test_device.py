"""--device on every command that runs a model: auto takes CUDA when there is a GPU, else the CPU; cuda without a
GPU is refused naming --device cpu; on the CPU, every choice gives what the library gives in-process."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers as T
from cli_support import TOPICS, hydra_ens, refused, text_encoder, text_files

from hydra_ensembles import metrics
from hydra_ensembles.cli import bench, build_parser, main
from hydra_ensembles.cli.common import CommandError, resolve_device
from hydra_ensembles.cli.predict import predictions
from hydra_ensembles.data.files import read_encoded
from hydra_ensembles.evaluation.ood import OOD_SCORES
from hydra_ensembles.inference import prepare
from hydra_ensembles.outputs import collect_member_logits
from hydra_ensembles.predictors import load_classifier, load_preprocessor
from hydra_ensembles.uncertainty import ensemble_probs

MODEL_COMMANDS = (
    "finetune",
    "amp",
    "scores",
    "circuit",
    "fuse",
    "evaluate",
    "distill",
    "calibrate",
    "ood",
    "predict",
    "demo",
    "bench",
)  # fmt: skip; members runs no model: it prunes and saves
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, text_encoder):
    """A tiny BERT classifier over the test topics, saved with its tokenizer."""
    root = tmp_path_factory.mktemp("device") / "classifier"
    classes = sorted(TOPICS)
    config = T.BertConfig.from_pretrained(text_encoder, num_labels=3, id2label=dict(enumerate(classes)))
    config.label2id = {c: i for i, c in enumerate(classes)}
    torch.manual_seed(1)
    model = T.BertForSequenceClassification(config)
    with torch.no_grad():  # at HF's init every probability is 1/3 +- 0.01 and any model passes: logits O(1)
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.mul_(5.0)
        model.classifier.weight.mul_(20.0)  # probabilities 0.48-0.77, bf16 within 0.008 of fp32 (measured)
    model.save_pretrained(root)
    T.BertTokenizer.from_pretrained(text_encoder).save_pretrained(root)
    return root


def _in_process_logits(classifier, path, precision="fp32", **columns) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Member logits (N, M, C) of the classifier on the CPU at `precision`, read as the CLI reads data, and the
    labels if any."""
    model = load_classifier(classifier)
    kind, tokenizer = load_preprocessor(classifier)
    data = read_encoded(path, kind, tokenizer, model.config, **columns)
    labels = data.examples.labels
    ids = torch.tensor([model.config.label2id[label] for label in labels]) if labels else None
    return collect_member_logits(prepare(model, precision), data.batches), ids


def test_every_command_that_runs_a_model_takes_device():
    commands = build_parser()._subparsers._group_actions[0].choices
    for name in MODEL_COMMANDS:
        device = next(a for a in commands[name]._actions if "--device" in a.option_strings)
        assert device.default == "auto" and sorted(device.choices) == ["auto", "cpu", "cuda"], name


def test_resolve_device(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(CommandError, match="--device cpu"):
        resolve_device("cuda")
    with pytest.raises(CommandError, match="'tpu' is not a device"):
        resolve_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda") == torch.device("cuda")


@NO_GPU
def test_cuda_without_a_gpu_is_refused(tmp_path, classifier, text_files):
    result = refused(
        "predict", "--model", str(classifier), "--inputs", str(text_files["new"]), "--threshold", "0.5",
        "--device", "cuda"
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    message = result.stderr.strip()
    assert message.startswith("hydra-ens predict: error: --device cuda: no CUDA GPU") and "--device cpu" in message
    result = refused(
        "evaluate", "--model", str(classifier), "--data", str(text_files["val"]), "--out", str(tmp_path / "o"),
        "--device", "cuda"
    )  # fmt: skip
    assert result.returncode == 2 and "--device cpu" in result.stderr
    assert not (tmp_path / "o").exists()  # refused before anything is written
    for command in (("demo", "--size", "smoke"), ("bench", "text", "--quick")):
        result = refused(*command, "--out", str(tmp_path / "o"), "--device", "cuda")
        assert result.returncode == 2 and "--device cuda: no CUDA GPU" in result.stderr, command
    assert not (tmp_path / "o").exists()


def test_bench_experiments_that_run_on_the_cpu_refuse_cuda(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine
    for experiment in ("_amp", "_distill", "_zero_shot"):  # were the refusal missing: fail, do not run it
        monkeypatch.setattr(bench, experiment, lambda args: pytest.fail(f"bench {args.task} ran"))
    for task in ("amp-text", "distill-spiral", "zero-shot"):
        assert main(["bench", task, "--device", "cuda"]) == 2
        assert f"--device cuda: bench {task} runs on the CPU only" in capsys.readouterr().err


@NO_GPU
def test_predict_on_cpu_and_auto_matches_the_library(classifier, text_files):
    common = ("predict", "--model", str(classifier), "--inputs", str(text_files["new"]), "--threshold", "0.5")
    runs = {
        flag: [json.loads(line) for line in hydra_ens(*common, *flag, "--format", "jsonl").stdout.splitlines()]
        for flag in ((), ("--device", "cpu"), ("--device", "auto"))
    }
    logits, _ = _in_process_logits(classifier, text_files["new"], labelled=False)
    inputs = [row["input"] for row in runs[()]]
    expected = predictions(logits.double(), OOD_SCORES["msp"](logits.double()), 0.5, sorted(TOPICS), inputs)
    expected = [row | {"score": "msp", "threshold": 0.5} for row in expected]
    assert runs[()] == runs[("--device", "cpu")] == runs[("--device", "auto")] == expected


@NO_GPU
def test_evaluate_on_cpu_and_auto_matches_the_library(tmp_path, classifier, text_files):
    results = {}
    for device in ("cpu", "auto"):
        out = tmp_path / device
        hydra_ens(
            "evaluate", "--model", f"single={classifier}", "--data", str(text_files["test"]), "--text-column",
            "review", "--ood", str(text_files["ood"]), "--latency-repeats", "0", "--out", str(out), "--device", device,
        )  # fmt: skip
        results[device] = json.loads((out / "metrics.json").read_text())["results"]["single"]["metrics"]
        shutil.rmtree(out)
    logits, labels = _in_process_logits(classifier, text_files["test"], text_column="review", labelled=True)
    probs = ensemble_probs(logits.double())
    assert results["cpu"] == results["auto"]
    assert results["cpu"]["id"]["nll"] == pytest.approx(metrics.nll(probs, labels), abs=1e-9)
    assert results["cpu"]["id"]["acc"] == pytest.approx(metrics.accuracy(probs, labels), abs=1e-12)


def test_predict_and_evaluate_take_the_inference_precision():
    commands = build_parser()._subparsers._group_actions[0].choices
    for name in ("predict", "evaluate"):
        precision = next(a for a in commands[name]._actions if "--precision" in a.option_strings)
        assert precision.default == "fp32" and list(precision.choices) == ["fp32", "bf16"], name


def test_bf16_inference_on_cpu_is_close_to_fp32_and_not_the_same(classifier, text_files):
    model = load_classifier(classifier)
    kind, tokenizer = load_preprocessor(classifier)
    batches = read_encoded(text_files["new"], kind, tokenizer, model.config, labelled=False).batches
    fp32 = collect_member_logits(model, batches)
    bf16 = collect_member_logits(prepare(model, "bf16"), batches)
    assert bf16.dtype == torch.float32 and not torch.equal(bf16, fp32)  # autocast ran: the logits moved a little
    assert fp32.std(dim=0).min() > 0.2  # the inputs' logits differ: a wrong input or model would show
    torch.testing.assert_close(ensemble_probs(bf16.double()), ensemble_probs(fp32.double()), atol=2e-2, rtol=0)


@NO_GPU
def test_predict_and_evaluate_in_bf16_on_cpu(tmp_path, classifier, text_files):
    common = ("predict", "--model", str(classifier), "--inputs", str(text_files["new"]), "--threshold", "0.5")
    rows = {
        precision: [json.loads(line) for line in hydra_ens(*common, "--precision", precision, "--format", "jsonl",
                                                           "--device", "cpu").stdout.splitlines()]
        for precision in ("fp32", "bf16")
    }  # fmt: skip
    assert [r["prediction"] for r in rows["bf16"]] == [r["prediction"] for r in rows["fp32"]]
    for low, full in zip(rows["bf16"], rows["fp32"]):
        assert low["probability"] == pytest.approx(full["probability"], abs=2e-2)
    assert any(low["probability"] != full["probability"] for low, full in zip(rows["bf16"], rows["fp32"]))  # ran bf16
    out = tmp_path / "bf16"
    hydra_ens(
        "evaluate", "--model", str(classifier), "--data", str(text_files["test"]), "--text-column", "review",
        "--latency-repeats", "0", "--precision", "bf16", "--out", str(out),
    )  # fmt: skip
    record = json.loads((out / "hydra-ens.json").read_text())
    assert record["settings"]["precision"] == "bf16"
    nll = json.loads((out / "metrics.json").read_text())["results"]["classifier"]["metrics"]["id"]["nll"]
    nlls = {}
    for precision in ("bf16", "fp32"):
        logits, labels = _in_process_logits(
            classifier, text_files["test"], precision, text_column="review", labelled=True
        )
        nlls[precision] = metrics.nll(ensemble_probs(logits.double()), labels)
    assert nll == pytest.approx(nlls["bf16"], abs=1e-6) and nlls["bf16"] != pytest.approx(nlls["fp32"], abs=1e-5)
