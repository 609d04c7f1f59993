"""The paper's Tables 1-2 on real offline data: every baseline and both Hydra Ensembles, mean ± std over seeds.

    python benchmarks/tables.py text            # MiniLM on BBC News; writes benchmarks/results/text-bbc/
    python benchmarks/tables.py image           # small ViT on Fashion-MNIST; writes benchmarks/results/image-fmnist/
    python benchmarks/tables.py text --quick    # a reduced run (one seed, small splits), about 10 minutes

Outputs table.md, table.json (every number of every seed, the command, machine, wall time), reliability.png,
ood_scores.png and head_importance.png. Trained models are cached (`--cache`, default
~/.cache/hydra-ensembles/bench) and reused; an interrupted run resumes from the cache.
"""

import argparse
import os
import shlex
import sys
from pathlib import Path

import transformers

from hydra_ensembles.evaluation.suite import run
from hydra_ensembles.evaluation.tasks import TASKS
from hydra_ensembles.io import cache_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--quick", action="store_true", help="one seed, small splits, short training")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 2 (quick: 0)")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/<task>[-quick]")
    parser.add_argument("--cache", type=Path, default=cache_dir() / "bench")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    task = TASKS[args.task](quick=args.quick)
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    out = args.out or Path(__file__).parent / "results" / (task.name + ("-quick" if args.quick else ""))
    cache = args.cache / ("quick" if args.quick else "full")
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0])] + sys.argv[1:])
    summary = run(task, seeds, out, cache, command=command)
    print((out / "table.md").read_text())
    print(f"wrote {out}/ in {summary['wall_time_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
