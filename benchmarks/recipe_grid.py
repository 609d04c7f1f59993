"""Choose a benchmark task's single-model recipe on validation data: fine-tune the task's model (seed 0) with each
learning rate of a grid for the recipe's epochs and print every epoch's validation accuracy and NLL, plus the
epoch the recipe's monitor keeps. Test data is never read.

    python benchmarks/recipe_grid.py text-mpnet --lrs 2e-5 5e-5 1e-4 --epochs 6 --precision bf16
"""

import argparse
import time

from hydra_ensembles.bench.tasks import TASKS
from hydra_ensembles.training import finetune


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--lrs", type=float, nargs="+", required=True)
    parser.add_argument("--epochs", type=int, help="default: the task's recipe")
    parser.add_argument("--precision", choices=("fp32", "bf16"), help="default: the task's recipe")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    task = TASKS[args.task]("full")
    recipe = task.recipe.with_(seed=args.seed, patience=None)  # every epoch printed: no early stop
    if args.epochs:
        recipe = recipe.with_(epochs=args.epochs)
    if args.precision:
        recipe = recipe.with_(precision=args.precision)
    print(f"{task.name}: {recipe}")
    for lr in args.lrs:
        started = time.perf_counter()
        model = finetune(task.new_model(args.seed), task.train, recipe.with_(lr=lr), val_loader=task.val)
        history = "  ".join(f"{h['epoch']}: {h['val_acc']:.3f}/{h['val_nll']:.3f}" for h in model.training_history)
        minutes = (time.perf_counter() - started) / 60
        print(f"lr {lr:g} ({minutes:.1f} min) val acc/NLL by epoch  {history}  kept epoch {model.kept_epoch}")


if __name__ == "__main__":
    main()
