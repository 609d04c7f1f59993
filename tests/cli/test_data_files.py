"""A user's files read as written: commas, quotes, byte-order marks, class names, pixels; and an --out that a step
did not write is never deleted."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as T

from hydra_ensembles.cli.common import CommandError
from hydra_ensembles.cli.step import Output
from hydra_ensembles.data.files import class_ids, image_batches, label_ids, read_image_folder, read_texts


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


def test_class_names_come_from_id2label_and_integer_names_are_not_ids():
    config = T.BertConfig(num_labels=2, id2label={0: "neg", 1: "pos"})
    config.label2id = None  # as transformers saves a config given id2label alone
    assert class_ids(config) == {"neg": 0, "pos": 1}
    assert label_ids(["pos", "neg"], class_ids(config), 2) == [1, 0]
    assert label_ids(["1", "0"], class_ids(config), 2) == [1, 0]  # ids, where no class name is an integer
    named = {"0": 0, "2": 1}  # classes named "0" and "2": is "1" a name or an id?
    with pytest.raises(ValueError, match=r"label\(s\) \['1'\] are not classes of the model.*use those names\.$"):
        label_ids(["0", "1"], named, 2)


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


def test_an_interrupted_run_cleared_for_other_settings_says_so(tmp_path, capsys):
    Output(tmp_path / "step", "finetune", {"data": {"digest": "a"}, "lr": 1})
    Output(tmp_path / "step", "finetune", {"data": {"digest": "b"}, "lr": 1})
    assert "held an interrupted run with other settings (data;" in capsys.readouterr().out
    Output(tmp_path / "step", "scores", {})
    assert "held an interrupted run of another command (finetune)" in capsys.readouterr().out


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
