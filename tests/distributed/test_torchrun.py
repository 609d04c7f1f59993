"""torch.distributed scale-out on CPU with gloo: 2 processes give what 1 process gives."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch
from conftest import MODELS

import hydra_ensembles as he

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1] / "importance")]
from circuit_support import CANDIDATES  # noqa: E402
from worker import run_circuit, run_finetune  # noqa: E402

WORKER = Path(__file__).parent / "worker.py"


def torchrun(*args: str, timeout: float = 300) -> None:
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER)]
    result = subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.parametrize(
    "method, data",
    # auto: every rank must choose the same; "tied": S ties everywhere, the gathered secondary scores decide
    [("fast", "circuit"), ("reference", "circuit"), ("auto", "circuit"), ("fast", "tied")],
)
def test_two_process_circuit_extraction_equals_one_process(method, data, tmp_path):
    torchrun("circuit", str(tmp_path / "circuit.json"), method, data)
    two = he.Circuit.load(tmp_path / "circuit.json")
    one = run_circuit(method, data)
    # no removal ties (under "tied", not on S and the secondary score together): a rank that scored or reported the
    # wrong heads, or dropped the secondary score, would change the order (to index order, under "tied")
    assert one.removed != CANDIDATES[:4] and one.ties == [0, 0, 0, 0] and two.tie_break == "score"
    assert two.removed == one.removed and two.ties == one.ties
    # S is made of counts (accuracy, ranked ID/OOD pairs): the same counts give the same S up to float64 division
    assert two.scores == pytest.approx(one.scores, abs=1e-12)


@pytest.mark.parametrize(
    "args, said",
    [
        (["circuit", "circuit.json", "fast", "sharded"], "rank(s) [1] hold other validation data than rank 0"),
        (["finetune", "model.safetensors", "sharded"], "rank(s) [1] hold other training data than rank 0"),
    ],
)
def test_ranks_given_different_data_are_refused(args, said, tmp_path):
    """A DistributedSampler would give each rank part of the data: the candidates would be ranked on different
    data with no error, and training would wait forever for the rank with fewer batches (or, with as many, train
    each step on a part of the batch). Both compare every rank's data digest with rank 0's first."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER)]
    out = tmp_path / args[1]
    result = subprocess.run(
        [*command, args[0], str(out), *args[2:]], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode != 0 and not out.exists()
    assert said in result.stdout + result.stderr


def test_data_parallel_fine_tuning_equals_one_process(tmp_path):
    """Both runs train in float64 and differ only in the order their sums are taken (two half-batch gradients
    averaged by DDP vs one full-batch gradient; 1 thread vs the default thread count).

    Bound, from what is compared: each gradient element is a sum of at most n = 1e3 terms here (4 rows x 8
    tokens x 32 hidden), so the two gradients differ by at most n * eps64 * G, with eps64 = 2.2e-16 and G <= 1
    (gradients are clipped to norm 1). AdamW's update g / (|g| + eps_adam) changes by at most |dg| / eps_adam
    (eps_adam = 1e-8), times lr <= 1e-3, in each of S = 6 steps (2 epochs x 3 batches):
    bound = S * lr * n * eps64 * G / eps_adam = 6 * 1e-3 * 1e3 * 2.2e-16 / 1e-8 = 1.3e-7.
    (In float32, eps32 = 1.2e-7 makes the same bound exceed Adam's largest step: no tolerance would be derivable.)
    """
    torchrun("finetune", str(tmp_path / "model.safetensors"))
    two = safetensors.torch.load_file(tmp_path / "model.safetensors")
    one_model = run_finetune()
    one, one_history = one_model.state_dict(), one_model.training_history
    steps, lr, terms, eps64, grad, eps_adam = 6, 1e-3, 1e3, torch.finfo(torch.float64).eps, 1.0, 1e-8
    bound = steps * lr * terms * eps64 * grad / eps_adam
    assert max((two[k] - one[k]).abs().max().item() for k in one if one[k].is_floating_point()) < bound
    # the recorded loss is the whole batch's, as one process records it (each rank's own mean would differ)
    history = json.loads((tmp_path / "model.json").read_text())
    assert [h["loss"] for h in history] == pytest.approx([h["loss"] for h in one_history], abs=1e-9)
    rows = [json.loads((tmp_path / f"model.rows{r}.json").read_text()) for r in (0, 1)]
    sizes = [4, 4, 3]  # each batch split between the two ranks, every step, in the shuffled order of each epoch
    assert sorted(a + b for a, b in zip(*rows)) == sorted(sizes * 2) and all(n <= 2 for n in rows[0] + rows[1])
    untrained = MODELS["bert"]().double().state_dict()  # training moved the weights far beyond the bound
    assert max((one[k] - untrained[k]).abs().max().item() for k in one if one[k].is_floating_point()) > 1e4 * bound


def test_every_rank_stops_early_at_rank_0s_epoch(tmp_path):
    """Each rank decided early stopping on its own validation NLL: numbers that differ in the last bits between
    ranks (other rounding) could stop one rank an epoch before the other, which then waited for it forever. Here
    rank 1's NLL worsens every epoch (it alone would stop after epoch 2); rank 0's decides for both."""
    torchrun("finetune", str(tmp_path / "model.safetensors"), "skewed", timeout=180)
    first, second = (json.loads((tmp_path / f"model.rank{r}.json").read_text()) for r in (0, 1))
    assert len(first) > 2 and first == second  # rank 0 trained past epoch 2, and rank 1 with it
