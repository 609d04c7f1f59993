"""The comparison's records: one file per row, a recorded row measured again when its logits are needed and
missing, and the machine every result says it was measured on."""

import json

import torch
from conftest import MODELS, make_inputs

from hydra_ensembles.evaluation import compare


def test_a_row_with_a_slash_names_one_file(tmp_path):
    path = compare.row_file(tmp_path, "Taylor, 1 pruned/layer, zero-shot")
    assert path.parent == tmp_path and path.name == "Taylor, 1 pruned per layer, zero-shot.pt"


def test_a_recorded_row_whose_logits_are_missing_is_measured_again_when_they_are_needed(tmp_path):
    """`hydra-ens evaluate` reads every row's logits back: a record without them (a stop between the two saves, a
    deleted file) must not send it to a missing file; benchmark records, which often travel without logits, do."""
    built = []
    data = compare.Data([make_inputs("bert", seed=1) | {"labels": torch.tensor([0, 1, 2, 1])}])

    def build(name):
        return lambda: built.append(name) or compare.Built(MODELS["bert"](seed=0), {"heads": name})

    rows = {name: build(name) for name in ("one", "two")}
    record, logits = tmp_path / "results.json", tmp_path / "logits"
    compare.compare(rows, data, record, logits, require_logits=True)
    compare.row_file(logits, "two").unlink()
    assert list(compare.compare(rows, data, record, logits)) == ["one", "two"] and built == ["one", "two"]
    marked = {name: result | {"read": "back"} for name, result in json.loads(record.read_text()).items()}
    record.write_text(json.dumps(marked))
    results = compare.compare(rows, data, record, logits, require_logits=True)
    assert built == ["one", "two", "two"] and compare.row_file(logits, "two").exists()
    assert results["one"]["read"] == "back" and "read" not in results["two"]  # measured again, recorded anew


def test_the_machine_line_names_the_cpu_and_its_bf16_units():
    """bf16 speed-ups depend on the CPU (AMX, AVX512-BF16): every table's machine line names them."""
    line = compare.machine()
    assert compare.cpu_model() in line
    assert f"({torch.backends.cpu.get_cpu_capability()}, " in line  # the vector units torch's kernels use
    assert ("no AMX" in line) != torch.cpu._is_amx_tile_supported()
    assert compare.measured_here()["machine"] == line
