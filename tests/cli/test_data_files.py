"""A user's files read as written: commas, quotes, byte-order marks, class names, pixels; and an --out that a step
did not write is never deleted."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
import transformers as T
from PIL import Image

from hydra_ensembles.cli.common import CommandError
from hydra_ensembles.cli.finetune import kept_epoch_line
from hydra_ensembles.cli.step import Output
from hydra_ensembles.data.files import class_ids, image_batches, label_ids, read_image_folder, read_texts
from hydra_ensembles.training import TEXT_RECIPE


def test_a_csv_row_with_an_unquoted_comma_is_refused_not_cut(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text('label,text\nsports,"The coach said, after the match, that we won"\n')
    assert read_texts(data, label_column="label").inputs == ["The coach said, after the match, that we won"]
    data.write_text("label,text\nsports,The coach said, after the match, that we won\n")  # was read "The coach said"
    with pytest.raises(ValueError, match="line 2: 4 fields where the header has 2: quote a text that holds commas"):
        read_texts(data, label_column="label")
    data.write_text("label,text\nsports\n")
    with pytest.raises(ValueError, match="line 2: 1 fields where the header has 2"):
        read_texts(data, label_column="label")


def test_tsv_quotes_are_text_and_a_byte_order_mark_is_not_a_column_name(tmp_path):
    tsv = tmp_path / "d.tsv"
    tsv.write_text('label\ttext\npos\t"Great" movie\nneg\t"a start\npos\tc end" x\n')
    examples = read_texts(tsv, label_column="label")
    assert examples.inputs == ['"Great" movie', '"a start', 'c end" x'] and examples.labels == ["pos", "neg", "pos"]
    excel = tmp_path / "excel.csv"
    excel.write_bytes("label,text\nneg,bad\n".encode("utf-8-sig"))
    assert read_texts(excel, label_column="label").labels == ["neg"]


def test_a_tsv_that_a_quoting_writer_wrote_reads_back_as_written(tmp_path):
    """pandas' to_csv(sep="\\t"), Python's csv and Excel quote a field holding a quote (doubling it), a tab or a
    line end: read unquoted, the model would train on the quoting marks. The unquoted files above stay as they
    are."""
    texts = ['He said "great" movie', "a tab\there", "two\nlines", "plain"]
    tsv = tmp_path / "written.tsv"
    with tsv.open("w", newline="") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerow(["label", "text"])
        writer.writerows([["pos", text] for text in texts])
    assert read_texts(tsv, label_column="label").inputs == texts
    doubled = tmp_path / "doubled.tsv"  # quotes doubled only: no tab or line end to give the quoting away
    doubled.write_text('label\ttext\npos\t"He said ""great"" movie"\nneg\tplain\n')
    assert read_texts(doubled, label_column="label").inputs == ['He said "great" movie', "plain"]
    pandas = tmp_path / "pandas.tsv"  # a quoted text of three lines: its middle line holds no quote
    pandas.write_text('label\ttext\npos\t"first line\nsecond line\nthird line"\nneg\tplain\n')
    assert read_texts(pandas, label_column="label").inputs == ["first line\nsecond line\nthird line", "plain"]
    stray = tmp_path / "stray.tsv"  # a row short of a field, and a quote on another line: refused, not merged
    stray.write_text('label\ttext\npos\t"a start\nneg\nneg\tthe end" here\n')
    with pytest.raises(ValueError, match="line 3: 1 fields where the header has 2"):
        read_texts(stray, label_column="label")


def test_class_names_come_from_id2label_and_integer_names_are_not_ids():
    config = T.BertConfig(num_labels=2, id2label={0: "neg", 1: "pos"})
    config.label2id = None  # as transformers saves a config given id2label alone
    assert class_ids(config) == {"neg": 0, "pos": 1}
    assert label_ids(["pos", "neg"], class_ids(config), 2) == [1, 0]
    assert label_ids(["1", "0"], class_ids(config), 2) == [1, 0]  # ids, where no class name is an integer
    named = {"0": 0, "2": 1}  # classes named "0" and "2": is "1" a name or an id?
    with pytest.raises(ValueError, match=r"label\(s\) \['1'\] are not classes of the model.*use those names\.$"):
        label_ids(["0", "1"], named, 2)
    # ids 1..C, one off: the message names the id out of range, not the valid ones beside it
    with pytest.raises(ValueError, match=r"label id\(s\) \[2\] are outside the model's 2 classes .ids 0..1"):
        label_ids(["1", "2"], class_ids(config), 2)
    with pytest.raises(ValueError, match=r"label\(s\) \['1'\] are not classes of the model"):
        label_ids(["pos", "1"], class_ids(config), 2)  # names and ids mixed, every id in range


def test_texts_are_cut_at_the_models_positions_when_the_tokenizer_has_no_limit(tmp_path):
    """A tokenizer saved without `model_max_length` leaves the model's positions the only limit: past them the
    forward pass failed with a shape error; the RoBERTa family's positions start after the padding index."""
    from conftest import MODELS, VOCAB

    from hydra_ensembles.data.files import model_positions, read_encoded
    from hydra_ensembles.evaluation.shift import text_data

    model = MODELS["bert"]()  # 24 positions
    assert model_positions(model.config) == model.config.max_position_embeddings == 24
    assert model_positions(T.RobertaConfig(max_position_embeddings=514, pad_token_id=1)) == 512
    for family in (T.CamembertConfig, T.Data2VecTextConfig):  # RoBERTa's positions under other names
        assert model_positions(family(max_position_embeddings=514, pad_token_id=1)) == 512
    assert model_positions(T.DebertaV2Config(position_biased_input=False)) is None  # relative positions only
    words = [f"w{i}" for i in range(VOCAB - 5)]
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = T.BertTokenizer(vocab={token: i for i, token in enumerate(special + words)})
    assert tokenizer.model_max_length > 10**6  # no limit of its own
    (tmp_path / "long.txt").write_text(" ".join(words[:40]) + "\nw1 w2\n")
    encoded = read_encoded(tmp_path / "long.txt", "text", tokenizer, model.config, labelled=False, max_length=128)
    assert encoded.cut == 1 and max(batch["input_ids"].shape[1] for batch in encoded.batches) == 24
    model.eval()(**encoded.batches[0])  # runs
    shifted = text_data(tokenizer, [" ".join(words[:40])], [0], max_length=128, config=model.config)
    assert shifted.encode(shifted.texts)[0]["input_ids"].shape[1] == 24  # evaluate --shift's texts alike


def test_integer_pixels_are_0_to_255_and_float_pixels_0_to_1():
    processor = T.ViTImageProcessor(size={"height": 2, "width": 2}, do_normalize=False)
    as_int = image_batches(processor, [np.array([[0, 64], [128, 255]], dtype=np.int64)], channels=1)
    as_uint8 = image_batches(processor, [np.array([[0, 64], [128, 255]], dtype=np.uint8)], channels=1)
    assert (as_int[0]["pixel_values"] == as_uint8[0]["pixel_values"]).all()  # was clipped to 0 or 255
    with pytest.raises(ValueError, match="float image pixels must be 0..1, got 0..255: divide"):
        image_batches(processor, [np.array([[0.0, 255.0]])], channels=1)


def test_a_16_bit_image_file_keeps_its_range_and_a_float_one_is_refused(tmp_path):
    """PIL's own convert("L") clips 16-bit pixels above 255 to white: a scan's gradient read as all white."""
    from PIL import Image

    (tmp_path / "scans").mkdir()
    gradient = np.array([[0, 16384], [32768, 65535]], dtype=np.uint16)
    Image.fromarray(gradient).save(tmp_path / "scans" / "a.png")
    images = read_image_folder(tmp_path / "scans").inputs
    assert images[0].mode.startswith("I")  # as PIL opens it: 16 bits
    processor = T.ViTImageProcessor(size={"height": 2, "width": 2}, do_normalize=False, resample=0)
    pixels = image_batches(processor, images, channels=1)[0]["pixel_values"][0, 0]
    expected = torch.tensor([[0, 64], [128, 255]]) / 255  # 16384 / 257 = 63.75
    torch.testing.assert_close(pixels, expected, atol=1 / 255, rtol=0)
    with pytest.raises(ValueError, match="PIL mode 'F'.*no fixed pixel range"):
        image_batches(processor, [Image.fromarray(gradient.astype(np.float32))], channels=1)


def test_a_16_bit_png_with_a_transparent_grey_is_read_on_white(tmp_path):
    """A 16-bit PNG names one grey transparent (tRNS); the 8-bit copy lost it and showed black. Only the exact
    16-bit grey is transparent: 1001 rounds to the same 8 bits as 1000 and stays opaque."""
    from PIL import Image

    (tmp_path / "scans").mkdir()
    Image.fromarray(np.array([[1000, 1001]], dtype=np.uint16)).save(tmp_path / "scans" / "a.png", transparency=1000)
    image = read_image_folder(tmp_path / "scans").inputs[0]
    assert image.mode.startswith("I") and image.info["transparency"] == 1000
    processor = T.ViTImageProcessor(size={"height": 1, "width": 2}, do_normalize=False, resample=0)
    pixels = image_batches(processor, [image], channels=1)[0]["pixel_values"][0, 0]  # (1, 2)
    torch.testing.assert_close(pixels, torch.tensor([[1.0, 4 / 255]]), atol=1e-6, rtol=0)


def test_a_transparent_image_is_read_on_white_as_transformers_reads_it():
    """PIL's convert("RGB") drops the alpha channel: a transparent pixel shows the colour it holds (black here).
    Transparency comes as an alpha band (RGBA, LA, PA), an RGBA palette, or one colour named transparent (P, L,
    RGB)."""
    rgba = np.zeros((1, 2, 4), dtype=np.uint8)
    rgba[0, 1] = (255, 0, 0, 255)  # opaque red beside a transparent black pixel
    processor = T.ViTImageProcessor(size={"height": 1, "width": 2}, do_normalize=False, resample=0)
    palette = Image.fromarray(np.array([[0, 1]], dtype=np.uint8), "P")
    palette.putpalette([0, 0, 0, 255, 0, 0])
    palette.info["transparency"] = 0  # palette entry 0 (black) is transparent
    keyed = Image.fromarray(rgba[..., :3], "RGB")
    keyed.info["transparency"] = (0, 0, 0)  # a PNG's tRNS colour key
    alpha_palette = Image.fromarray(np.array([[0, 1]], dtype=np.uint8), "P")
    alpha_palette.putpalette([0, 0, 0, 0, 255, 0, 0, 255], "RGBA")  # entry 0 transparent in the palette itself
    for image in (Image.fromarray(rgba, "RGBA"), palette, keyed, alpha_palette):
        pixels = image_batches(processor, [image], channels=3)[0]["pixel_values"][0]  # (3, 1, 2)
        assert pixels[:, 0, 0].tolist() == [1.0, 1.0, 1.0], image.mode
        assert pixels[:, 0, 1].tolist() == [1.0, 0.0, 0.0], image.mode
    grey = np.array([[[0, 0], [128, 255]]], dtype=np.uint8)  # transparent black beside opaque grey
    for image in (Image.fromarray(rgba, "RGBA"), Image.fromarray(grey, "LA")):
        pixels = image_batches(processor, [image], channels=1)[0]["pixel_values"][0, 0]
        assert pixels[0, 0].item() == 1.0, image.mode


def test_an_interrupted_run_cleared_for_other_settings_says_so(tmp_path, capsys):
    Output(tmp_path / "step", "finetune", {"data": {"digest": "a"}, "lr": 1})
    Output(tmp_path / "step", "finetune", {"data": {"digest": "b"}, "lr": 1})
    said = "held an interrupted run of `hydra-ens finetune` with other settings (--data; an input's size or time"
    assert said in capsys.readouterr().out
    Output(tmp_path / "step", "scores", {"max_length": 64})
    assert "held an interrupted run of another command, `hydra-ens finetune`" in capsys.readouterr().out
    Output(tmp_path / "step", "scores", {"max_length": 64}).finish({})
    with pytest.raises(
        CommandError, match=r"holds the finished run of `hydra-ens scores` with other settings \(--max-length;"
    ):
        Output(tmp_path / "step", "scores", {"max_length": 32})
    with pytest.raises(CommandError, match="holds the finished run of another command, `hydra-ens scores`; choose"):
        Output(tmp_path / "step", "circuit", {})
    recipe = {"epochs": 3, "lr": 1e-4, "label_smoothing": 0.0}
    Output(tmp_path / "tuned", "finetune", {"recipe": recipe, "source": {"digest": "a"}}).finish({})
    with pytest.raises(CommandError, match=r"other settings \(--epochs, --lr, --scores/--circuit; an input"):
        Output(tmp_path / "tuned", "finetune", {"recipe": recipe | {"epochs": 4, "lr": 1e-3}, "source": {}})


def test_an_out_folder_a_step_did_not_write_is_refused_and_kept(tmp_path):
    mine = tmp_path / "my-classifier"
    mine.mkdir()
    (mine / "model.safetensors").write_text("weights")
    for force in (False, True):
        with pytest.raises(CommandError, match="already holds files that no hydra-ens step wrote"):
            Output(mine, "calibrate", {"label_column": "lable"}, force=force)
    assert sorted(p.name for p in mine.iterdir()) == ["model.safetensors"]
    stopped = Output(tmp_path / "step", "calibrate", {"a": 1})  # a step's own folder, stopped by bad input
    (stopped.path / "part").write_text("x")
    Output(tmp_path / "step", "calibrate", {"a": 2})  # another run clears what the first left unfinished
    assert not (stopped.path / "part").exists()


def test_distill_refuses_a_teacher_that_prepares_its_inputs_otherwise(tmp_path):
    from hydra_ensembles.cli.distill import _check_same_preprocessor

    def processor_dir(name: str, side: int):
        T.ViTImageProcessor(size={"height": side, "width": side}).save_pretrained(tmp_path / name)
        return tmp_path / name

    student, same, other = processor_dir("s", 16), processor_dir("t", 16), processor_dir("o", 32)
    _check_same_preprocessor(same, student)  # the same processing: the teacher reads what it was trained on
    with pytest.raises(CommandError, match="prepares its inputs otherwise than --model"):
        _check_same_preprocessor(other, student)  # another image size
    (tmp_path / "bare").mkdir()
    _check_same_preprocessor(tmp_path / "bare", student)  # no preprocessor of its own: taken as it is


def test_force_refuses_an_out_that_holds_the_steps_own_input(tmp_path):
    """`finetune --model run --out run --force`: the input model lives in --out; starting over would delete it."""
    from hydra_ensembles.cli.step import fingerprint_path

    run = Output(tmp_path / "run", "finetune", {"lr": 1})
    (run.path / "model").mkdir()
    (run.path / "model" / "model.safetensors").write_text("weights")
    run.finish({"model_dir": "model"})
    settings = {"model": fingerprint_path(run.path / "model", "--model"), "lr": 2}
    with pytest.raises(CommandError, match="holds this step's input .*Choose another --out"):
        Output(run.path, "finetune", settings, force=True)
    assert (run.path / "model" / "model.safetensors").read_text() == "weights"
    Output(tmp_path / "elsewhere", "finetune", settings, force=True)  # another --out is fine
    report = Output(run.path / "report", "evaluate", {"models": {"a": settings["model"]}})  # inside an input's parent
    report.finish()
    Output(run.path / "report", "evaluate", {"models": {"a": settings["model"]}}, force=True)  # clears the report only


def test_a_steps_output_inside_its_input_is_no_part_of_the_inputs_fingerprint(tmp_path):
    """`evaluate --model run --out run/report`: the report written inside `run` must not change `run`'s fingerprint,
    or the finished step would be "a different run" when repeated and an interrupted one could never resume."""
    from hydra_ensembles.cli.step import fingerprint_path

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "model.safetensors").write_text("weights")
    before = fingerprint_path(tmp_path / "run", "--model")
    settings = {"models": {"a": before}}
    report = Output(tmp_path / "run" / "report", "evaluate", settings)
    (report.path / "metrics.json").write_text("{}")
    assert fingerprint_path(tmp_path / "run", "--model") == before
    report.finish()
    assert Output(
        tmp_path / "run" / "report", "evaluate", {"models": {"a": fingerprint_path(tmp_path / "run", "-")}}
    ).done()
    (tmp_path / "run" / "extra.bin").write_text("a changed input")  # a file of the input itself still counts
    assert fingerprint_path(tmp_path / "run", "--model") != before
    step = Output(tmp_path / "step", "finetune", {"lr": 1})  # an input that is a step's output itself: its files count
    (step.path / "model.safetensors").write_text("weights")
    step.finish()
    finished = fingerprint_path(step.path, "--model")
    (step.path / "model.safetensors").write_text("other weights")
    assert fingerprint_path(step.path, "--model") != finished


def test_text_lines_split_at_line_ends_only_and_a_byte_order_mark_is_dropped(tmp_path):
    """A JSON string may hold U+2028 raw (json.dumps(ensure_ascii=False)), a text a form feed: neither ends a line.
    A byte-order mark (Notepad's UTF-8) is not part of the first example or of the first JSON line."""
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text('\ufeff{"text": "one\u2028two", "label": "a"}\r\n{"text": "three", "label": "b"}\n', "utf-8")
    examples = read_texts(jsonl, label_column="label")
    assert examples.inputs == ["one\u2028two", "three"] and examples.labels == ["a", "b"]
    txt = tmp_path / "inputs.txt"
    txt.write_text("\ufefffirst\x0cpage\n\nsecond\u0085half\n", "utf-8")
    examples = read_texts(txt)
    assert examples.inputs == ["first\x0cpage", "second\u0085half"] and examples.names == ["line 1", "line 3"]


def test_an_image_folder_with_both_images_and_sub_folders_is_refused(tmp_path):
    for folder in ("photos", "photos/thumbs"):
        (tmp_path / folder).mkdir()
        Image.new("RGB", (8, 8)).save(tmp_path / folder / "a.png")
    with pytest.raises(ValueError, match="holds both images \\(a.png, ...: 1\\) and sub-folders \\(thumbs\\)"):
        read_image_folder(tmp_path / "photos")


def test_an_image_is_read_upright_by_its_exif_orientation(tmp_path):
    """A phone photo stored sideways with EXIF orientation 6 (rotate 90 degrees clockwise) is read as shown."""
    pixels = np.zeros((4, 8, 3), dtype=np.uint8)
    pixels[0, 0] = 255  # top left as stored
    image, exif = Image.fromarray(pixels), Image.Exif()
    exif[0x0112] = 6
    (tmp_path / "flat").mkdir()
    image.save(tmp_path / "flat" / "photo.png", exif=exif)
    upright = np.asarray(read_image_folder(tmp_path / "flat").inputs[0])
    assert upright.shape == (8, 4, 3) and upright[0, -1].sum() == 765  # stored top left: shown top right


def test_named_sources_read_a_path_with_an_equals_sign_as_a_path(tmp_path):
    from hydra_ensembles.cli.common import named_sources

    sweep = tmp_path / "runs" / "lr=3e-4" / "hydra-v1.5"
    sweep.mkdir(parents=True)
    assert named_sources([str(sweep)], "--model") == {"hydra-v1.5": str(sweep)}
    assert named_sources(["runs/lr=3e-4/other"], "--model") == {"other": "runs/lr=3e-4/other"}
    assert named_sources(["mine=runs/x", "data.csv"], "--ood") == {"mine": "runs/x", "data": "data.csv"}


def test_rebatch_gives_token_batches_without_a_mask_one_so_padding_is_not_attended():
    from hydra_ensembles.data.loaders import rebatch

    short, long = {"input_ids": torch.tensor([[5, 6]])}, {"input_ids": torch.tensor([[7, 8, 9]])}
    merged = rebatch([short, long], 2)[0]
    assert merged["input_ids"].tolist() == [[5, 6, 0], [7, 8, 9]]
    assert merged["attention_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert "attention_mask" not in rebatch([short, short], 2)[0]  # same lengths: nothing padded, inputs as given


def test_zero_shot_class_files_are_utf8_txt_and_another_file_is_refused(tmp_path):
    import argparse

    from hydra_ensembles.cli.common import zero_shot_options

    names = tmp_path / "classes.txt"
    names.write_text("\ufeffcafé\nnaïve\n", "utf-8")
    assert zero_shot_options(argparse.Namespace(classes=str(names), templates=None)).classes == ["café", "naïve"]
    (tmp_path / "classes.csv").write_text("a,b\n")
    with pytest.raises(CommandError, match="is a file: give the entries in a .txt file"):
        zero_shot_options(argparse.Namespace(classes=str(tmp_path / "classes.csv"), templates=None))


def test_texts_cut_counts_what_the_token_limit_cuts(capsys):
    """--max-length cut long texts without a word: the count is said now."""
    from conftest import build_clip_tokenizer

    from hydra_ensembles.data.files import text_batches, texts_cut

    tokenizer = build_clip_tokenizer(max_length=24)  # letters: a word of n letters is n tokens, plus BOS and EOS
    texts = ["cat", "abcdefgh", "abcdefghijklmnopqrstuvwxyz"]
    lengths = [
        int(batch["attention_mask"].sum()) for batch in text_batches(tokenizer, texts, batch_size=1, max_length=8)
    ]
    assert lengths == [3, 8, 8]  # "cat" is one merged token; the others reach the limit
    assert texts_cut(tokenizer, texts, max_length=8) == 2
    assert texts_cut(tokenizer, texts, max_length=10) == 1  # 8 letters + 2 special tokens fit in 10
    assert texts_cut(tokenizer, texts, max_length=100) == 1  # the tokenizer's own limit (24) is the lower


def test_the_kept_epoch_line_says_where_training_stopped_early():
    history = [{"val_nll": nll, "val_acc": 0.5} for nll in (0.5, 0.6, 0.7)]
    recipe = TEXT_RECIPE.with_(epochs=4, patience=2, monitor="nll", min_delta=5e-4)
    line = kept_epoch_line(history, 1, recipe, validated=True)
    assert line.startswith("kept epoch 1 of 3: lowest validation NLL (0.5000; --monitor nll"), line
    assert line.endswith("; stopped early, at epoch 3 of 4, after 2 epochs without an improvement over 0.0005"), line
    assert "stopped" not in kept_epoch_line(history, 1, recipe.with_(epochs=3), validated=True)
