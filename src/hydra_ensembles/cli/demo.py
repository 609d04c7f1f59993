"""The demo: what a Hydra Ensemble does for a real model, on the embedded default (no model download, no GPU;
the Amazon sentences are fetched once from PyPI, vaderSentiment's source archive).

Fine-tunes the packaged all-MiniLM-L6-v2 on three BBC News topics (business, politics, sports), builds
Hydra (Taylor) and Hydra (Circ) — 3 members, each keeping two thirds of the heads of the model, fine-tuned
briefly and fused into one module — and compares them with the single model on held-out articles, the two unseen
BBC topics (near-OOD) and drug reviews and Amazon product reviews (far-OOD). About 6 minutes on 2 free CPU cores
the first time (339 s measured alone, 2026-11-27); trained models are cached (--cache), so a second run takes
seconds.
Writes a report folder: README.md (how to read it), table.md, table.json, reliability.png, ood_scores.png,
head_importance.png.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..bench import cache_dir, runner, suite
from ..bench.suite import ROWS
from ..bench.tasks import TEXT_SIZES, text_task
from ..evaluation.tables import COLUMNS, table_lines
from ..io import write_text_atomic
from .common import CommandError, add_device_argument, resolve_device
from .step import check_model_dir

EXAMPLE = """hydra-ens demo                                  # report in ./hydra-demo
hydra-ens demo --out report --rows Single "Temp. scaling" "Hydra (Taylor)" "Hydra (Circ)\""""

DEMO_ROWS = ("Single", "Hydra (Taylor)", "Hydra (Circ)")
SHOWN = [  # the columns of the table printed to the terminal (Acc, ECE, AUROC and FPR95 in %)
    column for column in COLUMNS if column.header in ("Acc", "NLL", "ECE", "AUROC near", "AUROC far", "FPR95 all")
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("hydra-demo"), help="report folder")
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=ROWS,
        default=DEMO_ROWS,
        metavar="ROW",
        help=f"methods to compare, any of {list(ROWS)}",
    )
    parser.add_argument(
        "--size", choices=("demo", "smoke"), default="demo", help="smoke: a tiny run that only checks the pipeline (CI)"
    )
    parser.add_argument(
        "--model",
        help="another BERT-style text encoder directory with its tokenizer (default: the packaged all-MiniLM-L6-v2)",
    )
    parser.add_argument("--cache", type=Path, help="default: $HYDRA_ENSEMBLES_CACHE/demo")
    add_device_argument(parser)


REPORT_TITLE = "# Hydra Ensembles demo report"  # the first line of the README.md the demo writes in --out


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    device = resolve_device(args.device)
    if args.model is not None:
        check_model_dir(args.model)
    readme = args.out / "README.md"
    if readme.is_file() and not readme.read_text(errors="replace").startswith(REPORT_TITLE):
        raise CommandError(  # `--out .` in a project: its README is not ours to replace
            f"--out {str(args.out)!r} holds a README.md the demo did not write; give another --out."
        )
    sizes = TEXT_SIZES[args.size]
    print(
        f"hydra-ens demo: BBC News ({sizes.train} training articles per topic), "
        f"{args.model or 'all-MiniLM-L6-v2'} on {device.type}; rows: {', '.join(args.rows)}"
    )
    task = text_task(args.size, args.model)
    cache = args.cache or cache_dir() / "demo"
    summary = runner.run(
        task,
        suite.TABLE,
        [0],
        args.out,
        cache,
        command="hydra-ens demo",
        rows=args.rows,
        progress=not args.quiet,
        device=device,
    )
    write_text_atomic(args.out / "README.md", report_readme(summary))
    print()
    print(terminal_table(summary["rows"], summary.get("latency")))
    print()
    for search in summary.get("circuit_search", {}).values():  # how many removals the data left undecided
        print(f"Hydra (Circ)'s circuit: {search}")
    print(f"Report: {args.out}/README.md (table.md, reliability.png, ood_scores.png, head_importance.png)")
    print(f"Wall time: {time.perf_counter() - started:.0f} s (trained models cached in {cache})")
    return 0


def terminal_table(rows: dict[str, dict], latency: dict[str, dict] | None = None) -> str:
    """The demo's table (the report renderer's text style); latency as median (min-max) over rounds."""
    return "\n".join(table_lines(rows, latency, columns=SHOWN, style="text"))


def report_readme(summary: dict) -> str:
    return f"""{REPORT_TITLE}

{summary["notes"][1]}

```
{terminal_table(summary["rows"], summary.get("latency"))}
```

How to read it:
- **Acc, NLL, ECE** (Acc, ECE, AUROC and FPR95 in %) on held-out in-distribution articles: lower NLL and ECE
  mean better-calibrated probabilities.
- **AUROC near / far**: how well the maximum softmax probability separates the in-distribution articles from
  unseen BBC topics (near-OOD) and from drug reviews and Amazon product reviews (far-OOD); OOD is the positive
  class.
  **FPR95**: the fraction of in-distribution articles flagged when 95% of the OOD ones are.
- **FLOPs x**: compute per example relative to the single model. **Latency x**: latency relative to the single
  model on one batch of {summary.get("latency_batch", "?")} articles, every model timed in turn over repeated
  interleaved rounds on this machine: the median ratio, and in brackets the lowest and highest round. On a CPU a
  fused ensemble costs about its FLOPs; another job on the machine during the run makes these numbers noisy.
- An ensemble's probability is the mean of its members' softmax outputs.

Files:
- `table.md`: every metric (Brier, adaptive ECE, AUPR-In / AUPR-Out, per-set AUROC), parameters and cost.
- `table.json`: every number, with the command, machine and wall time.
- `reliability.png`: confidence vs accuracy per bin on the test set (the diagonal is perfect calibration).
- `ood_scores.png`: histograms of the OOD score (one minus the maximum softmax probability) for ID, near and far.
- `head_importance.png`: Taylor importance of every attention head and the order in which circuit extraction
  removed them (late = useful) — which heads the members keep.

Machine: {summary["machine"]}. Wall time of this run: {summary["wall_time_s"]:.0f} s.
"""
