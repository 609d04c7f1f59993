"""Bad input: one clear line on stderr naming the problem and the fix, exit code 2, nothing written or lost."""

from __future__ import annotations

import json
import shutil

import pytest
import safetensors.torch
import torch
import transformers as T
from cli_support import clip_model, hydra_ens, refused, text_encoder, text_files

import hydra_ensembles as he
from hydra_ensembles.cli.common import duration_seconds
from hydra_ensembles.predictors import copy_preprocessor, load_predictor


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, text_encoder, text_files):
    out = tmp_path_factory.mktemp("err") / "single"
    hydra_ens(
        "finetune", "--model", str(text_encoder), "--data", str(text_files["train"]), "--epochs", "1", "--out", str(out)
    )
    return out / "model"


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory, classifier):
    """A fused ensemble of 3 members of the classifier, saved as `fuse` saves one (with its tokenizer)."""
    model = he.load_model(classifier)
    members = he.build_members(model, he.sample_members(torch.rand(2, 4), num_members=3, budget=1, seed=0))
    out = tmp_path_factory.mktemp("ens") / "ensemble"
    he.HydraEnsemble.fuse(members).save_pretrained(out)
    copy_preprocessor(classifier, out)
    return out


def fails(*args: str) -> str:
    result = refused(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message  # one line, no traceback
    assert message.startswith(f"hydra-ens {args[0]}: error:")
    return message


def test_missing_paths(tmp_path, classifier, text_files, monkeypatch):
    assert "--model '/nope' does not exist" in fails("scores", "--model", "/nope", "--data", "x.csv", "--out", "o")
    message = fails("scores", "--model", str(classifier), "--data", str(tmp_path / "gone.csv"), "--out", str(tmp_path))
    assert "gone.csv' does not exist" in message
    assert "not a model directory" in fails("scores", "--model", str(tmp_path), "--data", "x", "--out", "o")
    message = fails("scores", "--model", "org/name", "--data", "x.csv", "--out", "o")  # a Hub id
    assert "does not exist. If it is a Hub id: fetch it once (hf download org/name --local-dir DIR)" in message
    (tmp_path / "runs").mkdir()  # a mistyped path in a folder that exists is no Hub id
    monkeypatch.chdir(tmp_path)
    assert fails("scores", "--model", "runs/single", "--data", "x.csv", "--out", "o").endswith("does not exist.")
    (tmp_path / "scores").mkdir()  # a step's output that holds no model
    (tmp_path / "scores" / "hydra-ens.json").write_text('{"command": "scores", "finished": true, "results": {}}')
    message = fails("predict", "--model", str(tmp_path / "scores"), "--inputs", str(text_files["new"]))
    assert "is the output of `hydra-ens scores`, which holds no model: give your classifier's directory" in message
    (tmp_path / "tuned").mkdir()  # a step still running, or stopped
    (tmp_path / "tuned" / "hydra-ens.json").write_text('{"command": "finetune", "finished": false}')
    message = fails("predict", "--model", str(tmp_path / "tuned"), "--inputs", str(text_files["new"]))
    assert "holds an unfinished `hydra-ens finetune` run: run that command again to finish it" in message


def test_python_loaders_given_a_steps_folder_name_the_model_inside(classifier):
    """A CLI step keeps its model one level down (finetune: `model/`); the Python loaders, given the step's
    folder, say where."""
    inside = f"It holds a saved model one level down, in {str(classifier)!r}: load that (`hydra_ensembles.predictors"
    with pytest.raises(FileNotFoundError, match="has no config.json: it is not a saved model") as said:
        he.load_model(classifier.parent)
    assert inside in str(said.value)
    with pytest.raises(FileNotFoundError, match="holds no saved predictor") as said:
        load_predictor(classifier.parent)
    assert inside in str(said.value)
    with pytest.raises(FileNotFoundError, match="not a saved Hydra Ensemble") as said:
        he.HydraEnsemble.from_pretrained(classifier.parent)
    assert inside in str(said.value)


def test_wrong_model_type(tmp_path, text_files):
    gpt2 = tmp_path / "gpt2"
    T.GPT2LMHeadModel(T.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=50)).save_pretrained(gpt2)
    message = fails("scores", "--model", str(gpt2), "--data", str(text_files["val"]), "--out", str(tmp_path / "o"))
    assert "no adapter for GPT2LMHeadModel" in message and "Supported classes" in message


def test_a_base_encoder_where_a_classifier_is_needed(tmp_path, text_encoder, text_files):
    message = fails("predict", "--model", str(text_encoder), "--inputs", str(text_files["new"]), "--threshold", "0")
    assert "no classifier" in message and "hydra-ens finetune" in message


def test_unreadable_data(tmp_path, classifier, text_files):
    out = str(tmp_path / "o")
    no_column = tmp_path / "no-column.csv"
    no_column.write_text("body,label\nhello,sports\n")
    assert "has no column 'text'" in fails("scores", "--model", str(classifier), "--data", str(no_column), "--out", out)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    assert "not UTF-8" in fails("scores", "--model", str(classifier), "--data", str(binary), "--out", out)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "goal", "label": "sports"}\n{"text": "vote", \n')
    assert "line 2 is not valid JSON" in fails(
        "scores", "--model", str(classifier), "--data", str(broken), "--out", out
    )
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert "holds no examples" in fails("scores", "--model", str(classifier), "--data", str(empty), "--out", out)
    given = ["--model", str(classifier), "--data", str(text_files["val"]), "--label-column", "Category"]
    message = fails("scores", *given, "--out", out)  # named, so required: else silently label-free
    assert "has no column 'Category'" in message and "--label-column" in message
    images = tmp_path / "images"
    images.mkdir()
    torch.save({}, images / "not-an-image.png")
    too_many = fails(
        "scores", "--model", str(classifier), "--data", str(text_files["val"]), "--sequential", "9", "--out", out
    )
    assert "--sequential for layer 0 is 9" in too_many and "prune fewer heads" in too_many
    usage = refused("scores", "--model", str(classifier), "--data", "x", "--sequential", "a", "--out", out)
    assert (
        usage.returncode == 2 and "--sequential: expected a number of heads or a comma-separated list" in usage.stderr
    )
    assert "cannot read image" in fails("scores", "--model", str(classifier), "--data", str(images), "--out", out)
    unknown = tmp_path / "other-labels.csv"
    unknown.write_text("text,label\ngoal match,cooking\n")
    message = fails("evaluate", "--model", str(classifier), "--data", str(unknown), "--out", out)
    assert "['cooking'] are not classes of the model" in message and "business" in message
    ood = ["--ood", str(text_files["ood"])]
    message = fails("circuit", "--model", str(classifier), "--data", str(text_files["ood"]), *ood, "--out", out)
    assert "plain text without labels" in message


def test_a_model_whose_weights_are_missing_or_no_safetensors_file_is_one_line(tmp_path, classifier, text_files):
    """A model directory copied without its weights, or with Git LFS pointers in their place: one line, no
    traceback."""
    given = ["--data", str(text_files["val"]), "--out", str(tmp_path / "o")]
    bare = tmp_path / "bare"
    shutil.copytree(classifier, bare)
    (bare / "model.safetensors").unlink()
    assert "bare" in fails("scores", "--model", str(bare), *given)
    pointer = tmp_path / "pointer"
    shutil.copytree(classifier, pointer)
    (pointer / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\n")
    message = fails("scores", "--model", str(pointer), *given)
    assert f"cannot read the weights file in {str(pointer)!r}" in message and "git lfs pull" in message


@pytest.mark.parametrize(("given", "seconds"), [("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5h", 5400), (".5m", 30)])
def test_a_duration_is_a_number_and_its_unit(given, seconds):
    assert duration_seconds(given, "--time-budget") == seconds


def test_a_time_budget_without_a_unit_is_refused_naming_the_units(tmp_path, text_files):
    args = ["circuit", "--model", "/nope", "--data", str(text_files["val"]), "--out", str(tmp_path / "o")]
    for given in ("30", "1800", "30 minutes", "2d"):
        message = fails(*args, "--time-budget", given)
        assert f"--time-budget needs a unit: 30m, 2h or 90s (got {given!r})" in message
    assert "more than no time" in fails(*args, "--time-budget", "0m")
    assert not (tmp_path / "o").exists()


def test_budget_out_of_range(tmp_path, classifier, text_files):
    val, ood = str(text_files["val"]), str(text_files["ood"])
    message = fails(
        "circuit",
        "--model",
        str(classifier),
        "--data",
        val,
        "--ood",
        ood,
        "--budget",
        "8",
        "--out",
        str(tmp_path / "c"),
    )
    assert "budget must be between 1 and 7" in message
    hydra_ens("scores", "--model", str(classifier), "--data", val, "--out", str(tmp_path / "s"))
    message = fails(
        "members",
        "--model",
        str(classifier),
        "--scores",
        str(tmp_path / "s"),
        "--budget",
        "4",
        "--out",
        str(tmp_path / "m"),
    )
    assert "budget 4 for layer 0 is not below its 4 heads" in message
    message = fails(
        "members",
        "--model",
        str(classifier),
        "--scores",
        str(tmp_path / "s"),
        "--budget",
        "2",
        "--pool",
        "9",
        "--out",
        str(tmp_path / "m"),
    )
    assert "pool for layer 0 must be between its budget 2 and 4" in message
    message = fails(
        "members",
        "--model",
        str(classifier),
        "--scores",
        str(tmp_path / "s"),
        "--budget",
        "2",
        "--pool",
        "2",
        "--out",
        str(tmp_path / "m"),
    )
    assert "allow only 1 distinct member" in message and "--allow-identical" in message
    assert "allow_identical" not in message  # the flag's name, not the Python argument's
    scores = tmp_path / "s" / "scores.safetensors"  # scores of another model: one layer fewer
    safetensors.torch.save_file(
        {"scores": safetensors.torch.load_file(scores)["scores"][:-1]}, tmp_path / "x.safetensors"
    )
    message = fails(
        "members",
        "--model",
        str(classifier),
        "--scores",
        str(tmp_path / "x.safetensors"),
        "--out",
        str(tmp_path / "m2"),
    )
    assert "scores a model of shape (1, 4) (layers, heads), but --model has (2, 4) with 8 kept" in message
    assert "score this model (hydra-ens scores)" in message


def test_an_unsupported_architecture_is_refused_before_anything_else(tmp_path, text_files):
    gpt2 = tmp_path / "gpt2"  # no tokenizer saved either: the architecture must be what is reported
    T.GPT2LMHeadModel(T.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=50)).save_pretrained(gpt2)
    result = refused("finetune", "--model", str(gpt2), "--data", str(text_files["train"]), "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert "no adapter for GPT2LMHeadModel" in result.stderr and "Supported classes" in result.stderr
    assert "fine-tuning" not in result.stdout and "classification head" not in result.stdout


def test_a_head_with_classes_the_data_never_shows_is_warned_about(tmp_path, classifier):
    two_classes = tmp_path / "two.csv"
    two_classes.write_text("text,label\nmatch goal,sports\nvote party,politics\ngoal cup,sports\n")
    out = str(tmp_path / "o")
    result = hydra_ens(
        "finetune", "--model", str(classifier), "--data", str(two_classes), "--epochs", "1", "--out", out
    )
    warning = "the classifier has 3 classes but the training data has no example of 1 of them: ['business']"
    assert warning in result.stdout
    assert "(1 epoch, lr" in result.stdout and "1 epochs" not in result.stdout
    assert "kept epoch 1 of 1: the last (no --val to choose on)" in result.stdout


def test_a_command_that_takes_one_model_says_what_it_was_given(tmp_path, ensemble, text_files):
    data, given = str(text_files["val"]), ["--model", str(ensemble)]
    message = fails("amp", *given, "--data", data, "--delta-e", "0.01", "--out", str(tmp_path / "o"))
    assert "amp takes one model; --model" in message and "is a fused ensemble of 3 members" in message
    assert "model_type" not in message and not (tmp_path / "o").exists()  # refused before anything was written
    for command, extra in (
        ("scores", ["--data", data]),
        ("circuit", ["--data", data]),
        ("members", ["--scores", data]),
        ("distill", ["--teacher", str(ensemble), "--data", data]),
        ("finetune", ["--data", data]),
    ):
        message = fails(command, *given, *extra, "--out", str(tmp_path / "o"))
        assert f"{command} takes one model" in message and "a fused ensemble of 3 members" in message, message
    message = fails("fuse", "--members", str(ensemble), "--out", str(tmp_path / "o"))
    assert "not a members directory" in message and "it is a fused ensemble of 3 members" in message
    (tmp_path / "members").mkdir()
    (tmp_path / "members" / "members.json").write_text('{"members": []}')
    message = fails("predict", "--model", str(tmp_path / "members"), "--inputs", data, "--threshold", "0")
    assert "is a members directory (models not yet fused)" in message and "hydra-ens fuse --members" in message


def test_classes_on_a_text_classifier_name_the_real_problem_first(classifier, text_files):
    message = fails("predict", "--model", str(classifier), "--classes", "a,b", "--inputs", str(text_files["new"]))
    assert "one model (BertForSequenceClassification), a classifier of its own classes" in message
    assert "--classes (zero-shot class names, `classes` in Python) is for two-tower models" in message
    assert "calibration" not in message


def test_distill_refuses_a_teacher_of_one_member(tmp_path, classifier, text_files):
    given = ["--model", str(classifier), "--data", str(text_files["train"]), "--out", str(tmp_path / "o")]
    message = fails("distill", "--teacher", str(classifier), *given)
    assert "is one model (BertForSequenceClassification): a one-member teacher has no model uncertainty" in message
    assert "Pass an ensemble: a Hydra Ensemble (hydra-ens fuse)" in message


def test_distill_refuses_head_layers_beyond_the_student_before_the_teacher_runs(
    tmp_path, ensemble, classifier, text_files
):
    """--head-layers 99 was refused by distill() only after the teacher had run over the whole transfer set."""
    given = ["--teacher", str(ensemble), "--model", str(classifier), "--data", str(text_files["train"])]
    message = fails("distill", *given, "--head-layers", "99", "--out", str(tmp_path / "o"))
    assert "--head-layers must be in 0..2 (the student's layers), got 99" in message


def test_a_two_tower_model_is_refused_where_a_classifier_of_its_own_classes_is_needed(tmp_path, clip_model, text_files):
    data = str(text_files["val"])
    for command, extra in (("amp", ["--delta-e", "0.01"]), ("scores", []), ("distill", ["--teacher", str(clip_model)])):
        message = fails(command, "--model", str(clip_model), "--data", data, *extra, "--out", str(tmp_path / "o"))
        assert f"{command} takes a classifier with its own classes" in message and "two-tower" in message, message
        assert "model_type" not in message and not (tmp_path / "o").exists()


def test_towers_on_a_one_tower_model_is_refused_not_ignored(tmp_path, classifier, text_files):
    data = ["--data", str(text_files["val"]), "--ood", str(text_files["ood"])]
    args = ["circuit", "--model", str(classifier), *data, "--out", str(tmp_path / "o")]
    assert "--towers applies to a two-tower model run zero-shot" in fails(*args, "--towers", "image")
    assert not (tmp_path / "o").exists()


def test_a_circuit_search_that_fits_no_time_budget_is_refused_before_it_starts(tmp_path, classifier, text_files):
    """`auto` probes, predicts and refuses before any step, naming what fits; `--max-examples` subsamples."""
    data = ["--data", str(text_files["val"]), "--ood", str(text_files["ood"])]
    args = ["circuit", "--model", str(classifier), *data, "--budget", "2"]
    message = fails(*args, "--time-budget", "0.001s", "--out", str(tmp_path / "none"))
    # the fastest removes 8 heads per step (in bf16 only where bf16 measured faster than fp32 on this CPU)
    assert "no circuit search fits the time budget of 0.001 s" in message and "the fastest, multi-8" in message
    assert "`--time-budget 1m`" in message and not (tmp_path / "none" / "circuit_state.json").exists()
    assert "circuit_state.json.probe.json': a rerun with this state_path (the CLI: the same --out)" in message
    few = tmp_path / "none"  # the same --out: its kept probe plans the rerun, though the new setting clears the rest
    hydra_ens(*args, "--max-examples", "3", "--out", str(few))
    record = json.loads((few / "hydra-ens.json").read_text())
    assert record["settings"]["max_examples"] == 3 and record["results"]["timing"]["chose"] == "exact"
    circuit = json.loads((few / "circuit.json").read_text())
    assert circuit["timing"]["predicted_s"] > 0 and circuit["timing"]["measured_s"] > 0
    assert circuit["timing"]["probe_s"] == 0 and "the probe of the run refused for time" in circuit["note"]


def test_amp_refuses_settings_that_prune_nothing_before_the_step_starts(tmp_path, classifier, text_files):
    given = ["--model", str(classifier), "--data", str(text_files["val"]), "--out", str(tmp_path / "o")]
    for bad, named in (
        (["--delta-e", "nan"], "delta_e must be a finite number > 0"),  # no size accepted: nothing pruned
        (["--delta-e", "0.01", "--t-max", "0"], "t_max must be >= 1"),
        (["--delta-e", "0.01", "--recover-data", str(text_files["train"]), "--epochs", "0"], "epochs must be >= 1"),
    ):
        message = fails("amp", *given, *bad)
        assert named in message and "(--delta-e, --t-max, --temperature, --epochs, --lr)" in message, message
        assert not (tmp_path / "o").exists()


def test_amp_loss_auto_on_a_base_encoder_reads_labelled_data_without_its_labels(tmp_path, text_encoder, text_files):
    """amp --loss auto on a model without a classifier takes the label-free entropy: the data's labels
    (topics, no class of the encoder's default config) are not read, so not refused as unknown classes."""
    given = ["--model", str(text_encoder), "--data", str(text_files["val"]), "--loss", "auto"]
    result = refused("amp", *given, "--delta-e", "0.5", "--t-max", "2", "--out", str(tmp_path / "amp"))
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "amp" / "hydra-ens.json").read_text())["finished"]


def test_a_file_of_another_step_or_a_missing_ood_set_is_refused_before_the_step_starts(
    tmp_path, classifier, text_files
):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "scores.json").write_text('{"scores": [[0.1]]}')  # `scores` writes this beside the weights
    given = ["members", "--model", str(classifier), "--out", str(tmp_path / "m")]
    message = fails(*given, "--scores", str(tmp_path / "s" / "scores.json"))
    assert "is not what hydra-ens scores writes" in message and "output directory" in message
    message = fails(*given, "--circuit", str(tmp_path / "s" / "scores.json"))  # a JSON without the kept heads
    assert "is not what hydra-ens circuit writes (KeyError" in message
    message = fails(
        "circuit", "--model", str(classifier), "--data", str(text_files["val"]), "--out", str(tmp_path / "c")
    )
    assert "criterion 'avg' needs OOD validation data: pass --ood PATH" in message
    assert not (tmp_path / "m").exists() and not (tmp_path / "c").exists()


def test_monitoring_flags_without_validation_data_are_refused_and_patience_0_turns_stopping_off(
    tmp_path, text_encoder, text_files
):
    from argparse import Namespace

    from hydra_ensembles.cli.finetune import patience, recipe_from_flags

    data = ["--data", str(text_files["train"]), "--out", str(tmp_path / "o")]
    message = fails("finetune", "--model", str(text_encoder), *data, "--monitor", "nll")
    assert "--monitor choose(s) the kept epoch on validation data: add --val FILE" in message
    assert patience("none") == patience("0") == 0 and patience("3") == 3
    validated = Namespace(recipe="text", val="v.csv")
    assert recipe_from_flags(validated, "text", {"patience": 0}, "--val").patience is None
    assert recipe_from_flags(validated, "text", {"patience": None}, "--val").patience == 2  # the recipe's
    assert "expected a number of epochs" in refused("finetune", "--model", "m", *data, "--patience", "x").stderr


def test_the_demo_never_replaces_a_readme_it_did_not_write(tmp_path):
    (tmp_path / "README.md").write_text("my project\n")
    assert "holds a README.md the demo did not write" in fails("demo", "--out", str(tmp_path))
    assert (tmp_path / "README.md").read_text() == "my project\n"


def test_evaluate_leaves_a_model_card_of_the_users_own_and_scores_says_what_auto_chose(
    tmp_path, classifier, text_files
):
    model = tmp_path / "model"
    shutil.copytree(classifier, model)
    (model / "README.md").write_text("---\nlicense: mit\n---\n# my classifier\n")
    result = refused("evaluate", "--model", str(model), "--data", str(text_files["val"]), "--out", str(tmp_path / "e"))
    assert result.returncode == 0, result.stderr
    assert "card not updated" in result.stdout and "is not a hydra-ensembles model card" in result.stdout
    assert (model / "README.md").read_text() == "---\nlicense: mit\n---\n# my classifier\n"
    unlabelled = tmp_path / "val.csv"  # the label column misnamed: read as unlabelled, and said so
    unlabelled.write_text(text_files["train"].read_text().replace("text,label", "text,labels", 1))
    result = refused("scores", "--model", str(model), "--data", str(unlabelled), "--out", str(tmp_path / "s"))
    assert result.returncode == 0, result.stderr
    assert "--loss auto: entropy (no label column 'label' in --data: read as unlabelled" in result.stdout
    assert json.loads((tmp_path / "s" / "scores.json").read_text())["loss"] == "entropy"


def test_an_interrupted_members_or_fuse_step_loses_nothing(tmp_path, classifier, text_files, monkeypatch):
    """`members` writes each member whole with its tokenizer (a member saved without it was skipped by the rerun);
    `fuse --finetune-train` keeps its checkpoint until the fused model is saved (a crash between retrained all)."""
    from hydra_ensembles.cli import members as members_command
    from hydra_ensembles.fusion import HydraEnsemble

    scores, members = tmp_path / "s", tmp_path / "m"
    assert (
        refused("scores", "--model", str(classifier), "--data", str(text_files["val"]), "--out", str(scores)).returncode
        == 0
    )
    copies = {"n": 0}
    original_copy = members_command.copy_preprocessor

    def dies_on_the_second(source, target):
        copies["n"] += 1
        if copies["n"] == 2:
            raise KeyboardInterrupt("killed")
        original_copy(source, target)

    monkeypatch.setattr(members_command, "copy_preprocessor", dies_on_the_second)
    given = ["members", "--model", str(classifier), "--scores", str(scores), "--budget", "2", "--out", str(members)]
    assert refused(*given).returncode == 130  # interrupted while member1 was written
    monkeypatch.setattr(members_command, "copy_preprocessor", original_copy)
    assert refused(*given).returncode == 0
    assert all((members / f"member{i}" / "tokenizer_config.json").is_file() for i in range(3))

    original_save, saves = HydraEnsemble.save_pretrained, {"n": 0}

    def fails_once(self, path):
        saves["n"] += 1
        if saves["n"] == 1:
            raise KeyboardInterrupt("killed while saving")
        return original_save(self, path)

    monkeypatch.setattr(HydraEnsemble, "save_pretrained", fails_once)
    fuse = ["fuse", "--members", str(members), "--mlp", "stack", "--finetune-train", str(text_files["train"])]
    fuse += ["--epochs", "1", "--out", str(tmp_path / "f")]
    assert refused(*fuse).returncode == 130
    assert (tmp_path / "f" / "checkpoints" / "checkpoint.pt").is_file()  # the trained epoch, kept
    resumed = refused(*fuse)
    assert resumed.returncode == 0 and "resuming from" in resumed.stdout
    assert not (tmp_path / "f" / "checkpoints").exists() and (tmp_path / "f" / "ensemble").is_dir()


def test_flags_that_were_ignored_or_failed_late_are_refused_before_any_work(tmp_path, classifier, text_files):
    """Each of these ran: ignoring the flag (amp --epochs without --recover-data, fuse --seed without
    --finetune-train, members --classes on a one-tower model), failing with a traceback after the work (predict
    --output naming a folder, after all inference; --max-length -5; evaluate --latency-repeats -1, after every model
    ran), or saying it cut texts it could not cut (--max-length 1: the tokenizer keeps its 2 special tokens)."""
    model, data, out = str(classifier), str(text_files["val"]), str(tmp_path / "o")
    for flag, value in (("--batch-size", "0"), ("--max-length", "-5"), ("--latency-repeats", "-1")):
        command = "evaluate" if flag == "--latency-repeats" else "scores"
        usage = refused(command, "--model", model, "--data", data, flag, value, "--out", out)
        assert usage.returncode == 2 and f"argument {flag}: expected a whole number of at least" in usage.stderr
    message = fails("scores", "--model", model, "--data", data, "--max-length", "1", "--out", out)
    assert "max_length 1 leaves no token for the text: the tokenizer adds 2 special token(s)" in message
    assert "--max-length" in message
    message = fails("amp", "--model", model, "--data", data, "--delta-e", "0.01", "--epochs", "5", "--out", out)
    assert "--epochs and --lr set the recovery, which --recover-data FILE runs" in message
    message = fails("predict", "--model", model, "--threshold", "0.5", "--inputs", data, "--output", str(tmp_path))
    assert "is a folder: give a file path inside it" in message
    message = fails("predict", "--model", model, "--threshold", "0.5", "--inputs", data, "--output", "/nope/out.tsv")
    assert "its folder '/nope' does not exist" in message
    scores, members = tmp_path / "s", tmp_path / "m"
    assert refused("scores", "--model", model, "--data", data, "--out", str(scores)).returncode == 0
    given = ["members", "--model", model, "--scores", str(scores), "--budget", "2"]
    message = fails(*given, "--classes", "a,b", "--out", str(tmp_path / "m2"))
    assert "--classes (zero-shot class names, `classes` in Python) is for two-tower models" in message
    assert refused(*given, "--out", str(members)).returncode == 0
    message = fails("fuse", "--members", str(members), "--seed", "3", "--out", out)
    assert "--seed set(s) how to fine-tune the fused ensemble: add --finetune-train FILE" in message


def test_members_from_the_scores_of_another_model_say_so(tmp_path, classifier, text_files):
    """Scores (or a circuit) of another model of the same shape were taken without a word: its heads rank that
    model's. The step that made them recorded its --model beside them."""
    scores = tmp_path / "s"
    made = refused("scores", "--model", str(classifier), "--data", str(text_files["val"]), "--out", str(scores))
    assert made.returncode == 0
    members = ["members", "--scores", str(scores), "--budget", "2"]
    same = refused(*members, "--model", str(classifier), "--out", str(tmp_path / "m1"))
    assert same.returncode == 0 and "was made from the model" not in same.stderr
    other = tmp_path / "other"
    shutil.copytree(classifier, other)
    moved = refused(*members, "--model", str(other), "--out", str(tmp_path / "m2"))
    said = f"was made from the model at {str(classifier.resolve())!r} (not {str(other.resolve())!r})"
    assert moved.returncode == 0 and said in moved.stderr


def test_finetune_says_when_transformers_has_no_classifier_for_the_encoder(tmp_path):
    """DINOv3 has no classification class: finetune names that and the way left, not transformers' list of the
    model types it does know."""
    from hydra_ensembles.cli.common import CommandError
    from hydra_ensembles.cli.finetune import _classifier

    T.DINOv3ViTModel(T.DINOv3ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4)).save_pretrained(
        tmp_path / "dinov3"
    )
    with pytest.raises(CommandError, match="has no classifier, and transformers has no classification class for"):
        _classifier(tmp_path / "dinov3", ["cat", "dog"])
