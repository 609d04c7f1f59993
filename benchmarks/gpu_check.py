"""The library's GPU paths against the CPU, in one short run for a session lent a GPU (no test needs one).

    python benchmarks/gpu_check.py                 # on a machine with CUDA (about a minute)
    python benchmarks/gpu_check.py --device cpu    # the same steps on the CPU: checks the script itself

On a tiny random BERT classifier (tests/conftest.py), three members of uneven heads per layer:
1. the fused ensemble on the device (its layout for that device: padded on a GPU) against the same ensemble on the
   CPU (ragged), fp32 with TF32 off: max |difference| of the member logits;
2. fine-tuning the fused ensemble there under bf16 autocast through the one training loop (`finetune_fused`, two
   epochs, a checkpoint each): the losses, the kept epoch and any warning (a GPU has native bf16: none expected);
3. the trained ensemble saved (`save_predictor`) and loaded on the CPU (`load_predictor`): its logits against the
   device's, fp32;
4. `inference.prepare(..., "bf16")` on the device against fp32 there: the deviation bf16 inference costs.
Prints one line per step; exits 1 when a fp32 equality (steps 1 and 3) is off by more than 1e-5.
"""

import argparse
import copy
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from conftest import MODELS, make_inputs  # noqa: E402

import hydra_ensembles as he  # noqa: E402
from hydra_ensembles.inference import prepare  # noqa: E402
from hydra_ensembles.predictors import load_predictor, save_predictor  # noqa: E402
from hydra_ensembles.training import TrainConfig  # noqa: E402

EXACT = 1e-5  # the fusion contracts' bound (DESIGN.md)
HEAD_MAPS = [{0: [0, 1, 2], 1: [0, 1, 2, 3], 2: [1]}, {0: [0], 1: [1, 2], 2: [0, 2, 3]}, {0: [1, 3], 1: [3], 2: [2, 3]}]


def member_logits(ensemble, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return ensemble(**inputs).member_logits.float()  # (B, M, C)


def data(batches: int, seed: int) -> list[dict]:
    return [make_inputs("bert", seed=seed + b) | {"labels": torch.tensor([0, 1, 2, 1])} for b in range(batches)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    device = torch.device(parser.parse_args().device)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {name}, torch {torch.__version__}")
    torch.manual_seed(0)
    members = he.build_members(MODELS["bert"](), HEAD_MAPS)
    inputs = make_inputs("bert")
    on_cpu = he.HydraEnsemble.fuse(copy.deepcopy(members))
    on_device = he.HydraEnsemble.fuse([m.to(device) for m in members])
    moved = {k: v.to(device) for k, v in inputs.items()}
    fused_gap = (member_logits(on_device, moved).cpu() - member_logits(on_cpu, inputs)).abs().max().item()
    print(f"1. fused on {device.type} vs on the CPU (fp32): max |diff| {fused_gap:.1e}")

    on_move = [{k: v.to(device) for k, v in batch.items()} for batch in data(6, seed=10)]
    config = TrainConfig(epochs=2, lr=1e-3, precision="bf16", warmup=0.0)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        trained = he.training.finetune_fused(
            on_device, on_move[:4], config, val_loader=on_move[4:], checkpoint_dir=tmp, progress=False
        )
        history = [f"{epoch['loss']:.3f}" for epoch in trained.training_history]
        print(f"2. fine-tuned on {device.type} in bf16: epoch losses {history}, kept epoch {trained.kept_epoch}")
        for warning in said:
            print(f"   warning: {warning.category.__name__}: {str(warning.message)[:160]}")
        save_predictor(trained, Path(tmp) / "saved")
        loaded = load_predictor(Path(tmp) / "saved")
    saved_gap = (member_logits(trained, moved).cpu() - member_logits(loaded, inputs)).abs().max().item()
    print(f"3. saved on {device.type}, loaded on the CPU (fp32): max |diff| {saved_gap:.1e}")
    bf16 = member_logits(prepare(trained, "bf16"), moved)
    bf16_gap = (bf16 - member_logits(prepare(trained, "fp32"), moved)).abs().max().item()
    print(f"4. bf16 autocast vs fp32 on {device.type}: max |diff| {bf16_gap:.1e}")
    return 0 if max(fused_gap, saved_gap) <= EXACT else 1


if __name__ == "__main__":
    sys.exit(main())
