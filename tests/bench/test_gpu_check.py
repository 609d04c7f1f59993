"""benchmarks/gpu_check.py, the script a session lent a GPU runs, on the CPU: it must run there too (no test needs
a GPU), and its equalities hold on one device."""

import sys

import pytest
from conftest import load_script


@pytest.mark.filterwarnings("ignore:bf16 inference on this CPU will be slow")  # where bf16 is emulated
def test_the_gpu_check_runs_on_the_cpu_and_its_equalities_hold(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--device", "cpu"])
    assert load_script("gpu_check").main() == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines[1:] if not line.startswith(" ")] == ["1.", "2.", "3.", "4."]
    assert lines[1].endswith("max |diff| 0.0e+00")  # one device, one layout: the same module
