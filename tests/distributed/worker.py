"""Run by tests under `torchrun --nproc-per-node N`: circuit extraction or fine-tuning on a tiny BERT (the circuit
on `circuit_support`'s model and data, where heads change S and removals do not tie; or, with DATA "tied", on
its `tied_data`, where every removal ties on S and the secondary score decides; with DATA "sharded", rank 1
without the first ID batch, which the search must refuse; fine-tuning "sharded": rank 1 without the first
training batch, which the training loop must refuse; fine-tuning "skewed": validated with early stopping, rank 1's
validation NLL worse every epoch, as a rank whose rounding differs could see it).

python -m torch.distributed.run --standalone --nproc-per-node 2 tests/distributed/worker.py circuit OUT METHOD DATA
python -m torch.distributed.run --standalone --nproc-per-node 2 tests/distributed/worker.py finetune OUT [DATA]
"""

import json
import sys
from pathlib import Path

import safetensors.torch
import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parents[1] / "importance"))
from circuit_support import circuit_data, circuit_model, tied_data  # noqa: E402
from conftest import MODELS, make_inputs  # noqa: E402

import hydra_ensembles as he  # noqa: E402
from hydra_ensembles.distributed import init_from_env, is_main, rank, shutdown, world_size  # noqa: E402
from hydra_ensembles.training import TEXT_RECIPE, finetune  # noqa: E402


def training_data():
    """Two batches of 4 rows and one of 3, which 2 processes split 2 + 1: the weighting of unequal shares."""
    even = [make_inputs("bert", seed=s) | {"labels": torch.tensor([0, 1, 2, 1])} for s in (5, 6)]
    return [*even, make_inputs("bert", seed=7, batch=3) | {"labels": torch.tensor([2, 0, 1])}]


def run_circuit(method: str, data: str = "circuit") -> he.Circuit:
    model, batches = (MODELS["bert"](), tied_data()) if data == "tied" else (circuit_model(), circuit_data())
    if data == "sharded":  # rank 1 leaves out the first ID batch, as a DistributedSampler would split the data
        batches = (batches[0][rank() :], batches[1])
    return he.extract_circuit(model, *batches, "avg", budget=4, method=method, progress=False)


def run_finetune(data: str = "same") -> torch.nn.Module:
    # float64: the only difference between one process and two is the order in which per-example gradients are
    # summed (DDP averages the two half-batch gradients), so the bound in the test is derived from fp64 rounding.
    model = MODELS["bert"]().double()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0  # deterministic, so one process and many can be compared
    batches = training_data()
    if data == "sharded":  # rank 1 one batch short, as a DistributedSampler would split the data: DDP waited forever
        batches = batches[rank() :]
    if data == "skewed":
        return _finetune_skewed(model, batches)
    return finetune(model, batches, TEXT_RECIPE.with_(epochs=2, lr=1e-3, patience=None), progress=False)


def count_rows() -> list[int]:
    """The rows this rank trains on at each step, in order (filled as training runs): a rank that trained on the
    whole batch would match one process as well, with data parallelism gone."""
    from hydra_ensembles.data.loaders import batch_size
    from hydra_ensembles.training import loop

    counts, mine = [], loop._my_rows

    def counting(batch):
        share, rows = mine(batch)
        counts.append(batch_size(rows))
        return share, rows

    loop._my_rows = counting
    return counts


def _finetune_skewed(model: torch.nn.Module, batches) -> torch.nn.Module:
    """Early stopping (patience 1) on validation data where rank 1 sees its NLL worsen every epoch: alone, it would
    stop after epoch 2 while rank 0 trains on, and rank 0 would wait for it in the next step's all-reduce."""
    from hydra_ensembles.training import loop

    if rank() == 1:
        validate, epochs = loop.validate, iter(range(1, 100))
        loop.validate = lambda *args: validate(*args) | {"val_nll": float(next(epochs))}
    recipe = TEXT_RECIPE.with_(epochs=4, lr=1e-3, patience=1, warmup=0.0)
    return finetune(model, batches, recipe, val_loader=batches, progress=False)


if __name__ == "__main__":
    task, out = sys.argv[1], sys.argv[2]
    assert init_from_env("gloo") and world_size() == 2
    rows = count_rows()
    result = run_circuit(*sys.argv[3:5]) if task == "circuit" else run_finetune(*sys.argv[3:4])
    if is_main():
        if task == "circuit":
            result.save(out)
        else:
            safetensors.torch.save_file({k: v.contiguous() for k, v in result.state_dict().items()}, out)
            Path(out).with_suffix(".json").write_text(json.dumps(result.training_history))
    if task == "finetune":  # every rank's own history (ranks that trained alike recorded alike) and rows
        Path(out).with_suffix(f".rank{rank()}.json").write_text(json.dumps(result.training_history))
        Path(out).with_suffix(f".rows{rank()}.json").write_text(json.dumps(rows))
    shutdown()
