"""The comparison's records: one file per row, and the machine every result says it was measured on."""

import torch

from hydra_ensembles.evaluation import compare


def test_a_row_with_a_slash_names_one_file(tmp_path):
    path = compare.row_file(tmp_path, "Taylor, 1 pruned/layer, zero-shot")
    assert path.parent == tmp_path and path.name == "Taylor, 1 pruned per layer, zero-shot.pt"
    assert compare.row_file(tmp_path, "Single", ".json") == tmp_path / "Single.json"


def test_the_machine_line_names_the_cpu_and_its_bf16_units():
    """bf16 speed-ups depend on the CPU (AMX, AVX512-BF16): every table's machine line names them."""
    line = compare.machine()
    assert compare.cpu_model() in line
    assert f"({torch.backends.cpu.get_cpu_capability()}, " in line  # the vector units torch's kernels use
    assert ("no AMX" in line) != torch.cpu._is_amx_tile_supported()
    assert compare.measured_here()["machine"] == line
