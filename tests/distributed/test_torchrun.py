"""torch.distributed scale-out on CPU with gloo: 2 processes give what 1 process gives."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
from conftest import MODELS

import hydra_ensembles as he

sys.path.insert(0, str(Path(__file__).parent))
from worker import run_circuit, run_finetune  # noqa: E402

WORKER = Path(__file__).parent / "worker.py"


def torchrun(*args: str) -> None:
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER)]
    result = subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.parametrize("method", ["fast", "reference"])
def test_two_process_circuit_extraction_equals_one_process(method, tmp_path):
    torchrun("circuit", str(tmp_path / "circuit.json"), method)
    two = he.Circuit.load(tmp_path / "circuit.json")
    one = run_circuit(method)
    assert two.removed == one.removed
    assert two.scores == pytest.approx(one.scores, abs=1e-9)


def test_data_parallel_fine_tuning_equals_one_process(tmp_path):
    torchrun("finetune", str(tmp_path / "model.safetensors"))
    two = safetensors.torch.load_file(tmp_path / "model.safetensors")
    one = run_finetune().state_dict()
    assert max((two[k] - one[k]).abs().max().item() for k in one if one[k].is_floating_point()) < 1e-5
    untrained = MODELS["bert"]().state_dict()
    assert max((one[k] - untrained[k]).abs().max().item() for k in one if one[k].is_floating_point()) > 1e-3
