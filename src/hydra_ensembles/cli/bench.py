"""Benchmarks: the paper's Tables 1-2 on real offline data — every baseline and both Hydra Ensembles.

text: all-MiniLM-L6-v2 on BBC News topics (near-OOD: held-out topics; far-OOD: drug reviews, Amazon reviews).
sentiment: all-MiniLM-L6-v2 on movie-sentence sentiment (near-OOD: Amazon review sentences; far-OOD: BBC articles,
drug reviews, Reuters).
text-mpnet, sentiment-mpnet: the same two tasks on the pretrained all-mpnet-base-v2 (12 x 12 heads).
image: a small ViT trained on Fashion-MNIST (near-OOD: held-out classes; far-OOD: MNIST, digits, solar cells).
image-dinov2: the pretrained DINOv2-S (12 x 6 heads) fine-tuned on the same Fashion-MNIST splits
(`bash scripts/install.sh --pretrained` first).
distill-spiral, distill-regression, distill-text, distill-image, distill-image-dinov2, distill-sentiment-mpnet: Hydra
distillation (paper 001) against knowledge distillation — a toy spiral (with its uncertainty maps), a tabular
regression, and the suite tasks' Deep Ensembles and Hydra (Circ) (from the suite's cache) distilled into
transformer students whose heads are the last --head-layers layers.
amp-text, amp-image-dinov2: adaptive MLP pruning (paper 002) of the task's single model — a delta-E sweep, the
criteria, uniform-width baselines, each before and after recovery — and Hydra Ensembles on the pruned base
against the unpruned one, at the base the cost rule picks and along the sweep (writes amp.md, amp.json).
zero-shot: a LiT-style two-tower model (DINOv2-S locked + MiniLM, trained here once) classifying Fashion-MNIST
zero-shot, and its training-free Hydra Ensembles (both towers or the image tower pruned; Table 3's shape).
The suite tasks (text, sentiment, image and their pretrained versions) write table.md, table.json (every
number of every seed, the command, the machine, paired bootstrap intervals of the Hydra rows' differences from
Single and Deep Ensembles), reliability.png, ood_scores.png and head_importance.png; the others <experiment>.md and
.json. Protocol (issue 39): circuits on the OOD sources' validation parts, disjoint from their test parts; a third
of the heads pruned from pools twice the budget; validation-selected training (docs/evaluation.md). Everything
trained is cached (--cache) and reused; an interrupted run resumes at the first missing row. A full seed on 2 CPU
cores under protocol 1: text about 36 minutes, image 18, image-dinov2 about 2.3 hours, text-mpnet about 4.5 (most
of it the circuit search); protocol 2's times are being measured.
--records DIR keeps the cache's records (results, logits, scores, circuits, latency: everything but weights)
in DIR as well, so that a run can go on from another machine (`bench.records`).
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..adapters import get_adapter
from ..bench import amp, cache_dir, curve, distillation, runner, suite, zero_shot
from ..bench.tasks import TASKS, Task, with_prune_per_layer
from .common import CommandError, add_device_argument, resolve_device

EXAMPLE = """hydra-ens bench text --quick                 # one seed, small splits (about 10 minutes)
hydra-ens bench image --seeds 0 1 2 --out benchmarks/results/image-fmnist
hydra-ens bench distill-spiral                # Hydra distillation on the spiral toy set (about 3 minutes)"""
DISTILL_TASKS = ("text", "image", "image-dinov2", "sentiment-mpnet")  # suite tasks whose ensembles are distilled
DISTILL = {f"distill-{name}": name for name in (*distillation.EXPERIMENTS, *DISTILL_TASKS)}
AMP = {"amp-text": "text", "amp-image-dinov2": "image-dinov2"}
PUSH_MINUTES = 10  # --records: how often a running benchmark copies its records out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task", choices=sorted(TASKS) + sorted(DISTILL) + sorted(AMP) + sorted(zero_shot.TASKS))
    parser.add_argument("--quick", action="store_true", help="one seed, small splits, short training")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: 0 1 2 (quick: 0)")
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=suite.ALL_ROWS,
        metavar="ROW",
        help=f"default: the main table {list(suite.ROWS)}; also available: {list(suite.REVIEW_ROWS)}",
    )
    parser.add_argument(
        "--head-sweep",
        type=int,
        nargs="+",
        metavar="B",
        help="instead of the table: Taylor and CircAvg models pruning B heads per layer, zero-shot and fine-tuned "
        "(the paper's Figures 5-6); writes sweep.md, sweep.json, head_sweep.png",
    )
    parser.add_argument(
        "--head-layers",
        type=int,
        default=1,
        metavar="K",
        help="distill-<task>: the students' heads are the last K layers (the body, the others, runs once)",
    )
    parser.add_argument(
        "--cost-curve",
        action="store_true",
        help="instead of the table: Single (also on the fused engine), Deep Ensembles, Hydra (Circ) and the cheaper "
        "ensembles on the same base "
        f"({'; '.join(curve.CHEAPER_ROWS)}) at their FLOPs and latency, each chosen at a cost limit on "
        "validation data; writes cost_curve.md, cost_curve.json, cost_curve.png",
    )
    parser.add_argument(
        "--prune-per-layer",
        type=int,
        metavar="K",
        help="a labelled variant: every pruned model drops K heads per layer (default: the task's, a third); the "
        "suite and amp-* tables, cached and written apart (<out>-pruneK)",
    )
    amp_options = parser.add_argument_group("amp-* experiments")
    amp_options.add_argument("--deltas", type=float, nargs="+", default=list(amp.DELTAS), help="the delta-E sweep")
    amp_options.add_argument(
        "--flops-target",
        type=float,
        default=1.0,
        help="the AMP base of the ensembles: the smallest delta-E (the grid, refined by bisection) whose 3-member "
        "Hydra costs <= this x Single's FLOPs",
    )
    amp_options.add_argument("--recovery-epochs", type=int, help="recovery epochs (default: the paper's recipe, 10)")
    amp_options.add_argument(
        "--tables",
        nargs="+",
        choices=amp.TABLE_NAMES,
        default=list(amp.TABLE_NAMES),
        help="which tables to build; e.g. `--tables free` for the ensemble-for-free table alone",
    )
    parser.add_argument(
        "--latency-seeds",
        type=int,
        nargs="+",
        metavar="SEED",
        help="suite tables, --cost-curve and the amp-* free table: the seeds whose models are timed (default: the "
        "first seed); with several, the latency column is the mean ± std of each seed's median. Timing a seed "
        "needs its models: a cache without their weights trains them again",
    )
    parser.add_argument(
        "--untimed",
        action="store_true",
        help="suite tables and --cost-curve: no latency column. Rows the records hold are read back and only the "
        "others are built: timing needs every row's model, which a cache without their weights trains again",
    )
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/<task folder, e.g. text-bbc>[-quick]")
    parser.add_argument("--cache", type=Path, help="default: $HYDRA_ENSEMBLES_CACHE/bench")
    parser.add_argument(
        "--records",
        type=Path,
        metavar="DIR",
        help="suite and amp-* tables: read the task's records (results, logits, scores, circuits, latency; no "
        "weights) from DIR into the cache before the run, and write the cache's back to DIR when it ends or stops, "
        "so that it can go on from another machine (e.g. DIR = benchmarks/records, committed)",
    )
    parser.add_argument(
        "--records-only",
        action="store_true",
        help="with --records: copy the records both ways and stop, running nothing (e.g. to save a run's "
        "records while it is still going)",
    )
    add_device_argument(
        parser,
        "the suite tasks (text, sentiment, image and their pretrained versions); the distill-*, amp-* and "
        "zero-shot experiments run on the CPU",
    )


def run(args: argparse.Namespace) -> int:
    check_flags(args)
    device = resolve_device(args.device)
    if args.task in DISTILL:
        return _distill(args)
    if args.task in AMP:
        return _amp(args)
    if args.task in zero_shot.TASKS:
        return _zero_shot(args)
    task = _task(args, args.task)
    seeds = _seeds(args)
    out = args.out or Path("benchmarks") / "results" / (task.name + _suffix(args))
    cache = (args.cache or cache_dir() / "bench") / ("quick" if args.quick else "full")
    command = "hydra-ens " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    with _records(args, cache, task) as go_on:
        if not go_on:
            return 0
        if args.head_sweep:
            summary = suite.head_sweep(
                task, seeds, args.head_sweep, out, cache, command, progress=not args.quiet, device=device
            )
            print((out / "sweep.md").read_text())
            print(f"wrote {out}/ in {summary['wall_time_s'] / 60:.1f} min")
            return 0
        options = dict(
            command=command, rows=args.rows, progress=not args.quiet, device=device, latency_seeds=args.latency_seeds
        )
        if args.untimed:
            options["latency_repeats"] = 0
        if args.cost_curve:
            summary = curve.run(task, seeds, out, cache, **options)
            print((out / "cost_curve.md").read_text())
            print(f"wrote {out}/ in {summary['wall_time_s'] / 60:.1f} min")
            return 0
        summary = runner.run(task, suite.TABLE, seeds, out, cache, **options)
    print((out / "table.md").read_text())
    print(f"wrote {out}/ in {summary['wall_time_s'] / 60:.1f} min")
    return 0


def check_flags(args: argparse.Namespace) -> None:
    """Refuse, before any work, a flag the task does not use (it would be ignored) or values that disagree."""
    if args.task not in TASKS and args.device == "cuda":
        raise CommandError(
            f"--device cuda: bench {args.task} runs on the CPU only; leave --device out (or pass --device cpu)."
        )
    if (args.records or args.records_only) and (args.task in DISTILL or args.task in zero_shot.TASKS):
        raise CommandError(f"--records and --records-only apply to the suite and amp-* tables, not to {args.task}.")
    if args.cache is not None and DISTILL.get(args.task) in distillation.EXPERIMENTS:
        raise CommandError(f"--cache: bench {args.task} trains its small networks afresh and caches none; drop it.")
    if args.head_layers != 1 and DISTILL.get(args.task) not in DISTILL_TASKS:
        raise CommandError(
            f"--head-layers applies to the transformer students (distill-{', distill-'.join(DISTILL_TASKS)}), "
            f"not to {args.task}."
        )
    suite_flags = {"--rows": args.rows, "--head-sweep": args.head_sweep, "--cost-curve": args.cost_curve}
    given = [flag for flag, value in suite_flags.items() if value]
    if given and args.task not in TASKS:
        raise CommandError(f"{', '.join(given)} appl(y) to the suite tasks ({', '.join(TASKS)}), not to {args.task}.")
    amp_flags = {
        "--deltas": args.deltas != list(amp.DELTAS),
        "--flops-target": args.flops_target != 1.0,
        "--recovery-epochs": args.recovery_epochs is not None,
        "--tables": args.tables != list(amp.TABLE_NAMES),
    }
    given = [flag for flag, differs in amp_flags.items() if differs]
    if given and args.task not in AMP:
        raise CommandError(
            f"{', '.join(given)} appl(y) to the amp-* experiments ({', '.join(AMP)}), not to {args.task}."
        )
    if args.latency_seeds is not None and (args.head_sweep or (args.task not in TASKS and args.task not in AMP)):
        raise CommandError(
            "--latency-seeds applies to the timed tables (a suite task's table or --cost-curve, an amp-* task's "
            f"free table), not to {'--head-sweep' if args.head_sweep else args.task}."
        )
    if args.latency_seeds is not None and args.task in AMP and "free" not in args.tables:
        raise CommandError("--latency-seeds times the amp-* free table: add free to --tables, or drop the flag.")
    if args.latency_seeds is not None and not set(args.latency_seeds) <= set(_seeds(args)):
        raise CommandError(
            f"--latency-seeds {' '.join(map(str, args.latency_seeds))}: time some of the run's seeds "
            f"({' '.join(map(str, _seeds(args)))}; --seeds)."
        )
    if args.untimed and (args.head_sweep or args.task not in TASKS):
        raise CommandError(
            "--untimed applies to a suite task's table and --cost-curve, not to "
            f"{'--head-sweep' if args.head_sweep else args.task}."
        )
    if args.untimed and args.latency_seeds is not None:
        raise CommandError("--untimed renders no latency column: drop --latency-seeds, or --untimed to time them.")
    if args.head_sweep and args.cost_curve:
        raise CommandError("--head-sweep and --cost-curve each replace the table: give one of them.")
    if args.head_sweep and args.rows:
        raise CommandError("--head-sweep measures its own rows (each budget, zero-shot and fine-tuned): drop --rows.")
    if args.recovery_epochs is not None and args.recovery_epochs < 1:
        raise CommandError(f"--recovery-epochs must be at least 1, got {args.recovery_epochs}.")
    if args.prune_per_layer is not None and args.task not in TASKS and args.task not in AMP:
        raise CommandError(f"--prune-per-layer applies to the suite and amp-* tables, not to {args.task}.")


def _seeds(args: argparse.Namespace) -> list[int]:
    """The seeds run: --seeds, else the first (--quick) or three."""
    return args.seeds or ([0] if args.quick else [0, 1, 2])


def _task(args: argparse.Namespace, name: str) -> Task:
    """The benchmark task `name` at the size asked for, with `--prune-per-layer` applied (its own cache key)."""
    task = TASKS[name]("quick" if args.quick else "full")
    if args.prune_per_layer is None:
        return task
    model = task.new_model(0)
    adapter = get_adapter(model)
    layers, heads = adapter.num_layers(model), adapter.num_heads(model)
    if not 1 <= args.prune_per_layer < heads:
        raise CommandError(
            f"--prune-per-layer must be between 1 and {heads - 1} ({task.name}: {heads} heads per layer)."
        )
    return with_prune_per_layer(task, args.prune_per_layer, layers, heads)  # pools and notes follow the budget


@contextmanager
def _records(args: argparse.Namespace, cache: Path, task: Task) -> Iterator[bool]:
    """With --records: the task's records copied from DIR into the cache (the cache's own files win; results
    files are merged row by row), then the cache's copied back to DIR the same way every PUSH_MINUTES while the
    run goes on (a machine can vanish without a signal) and when it ends, fails or is stopped (SIGTERM, SIGHUP).
    Yields whether to run (not with --records-only)."""
    if args.records is None:
        if args.records_only:
            raise CommandError("--records-only needs --records DIR.")
        yield True
        return
    key = runner.task_key(task)
    pulled = runner.pull_records(args.records, cache, task)
    print(f"records: {len(pulled)} file(s) from {args.records / key} into the cache", flush=True)
    stopped = threading.Event()

    def push_now_and_then() -> None:
        while not stopped.wait(PUSH_MINUTES * 60):
            try:
                runner.push_records(cache, args.records, task)
            except Exception as error:  # noqa: BLE001 - a failed push must not end the pushes that follow
                print(f"records: could not save to {args.records / key} ({error}); trying again later", flush=True)

    pusher = threading.Thread(target=push_now_and_then, daemon=True)
    pusher.start()
    previous = {sig: signal.signal(sig, _exit_on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    failed = False
    try:
        yield not args.records_only
    except BaseException:
        failed = True
        raise
    finally:
        for sig in previous:  # a second signal must not cut the last push short
            signal.signal(sig, signal.SIG_IGN)
        try:
            stopped.set()
            pusher.join()
            pushed = runner.push_records(cache, args.records, task)
            print(f"records: {len(pushed)} file(s) new or changed, saved to {args.records / key}", flush=True)
        except Exception as error:
            if not failed:
                raise
            # the run's own error is the one to see: a failed last push is said, not raised in its place
            print(f"records: could not save to {args.records / key} ({error})", flush=True)
        finally:  # the caller's handlers back, even when the last push fails
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _exit_on_signal(signum: int, frame: object) -> None:
    """Stop by raising, so that `finally` blocks run (the records are saved on the way out)."""
    raise SystemExit(128 + signum)


def _suffix(args: argparse.Namespace) -> str:
    """The default output folder's suffix: what differs from the standard table."""
    return ("-quick" if args.quick else "") + (f"-prune{args.prune_per_layer}" if args.prune_per_layer else "")


def _distill(args: argparse.Namespace) -> int:
    name = DISTILL[args.task]
    seeds = _seeds(args)
    out = args.out or Path("benchmarks") / "results" / ("distillation" + ("-quick" if args.quick else ""))
    command = "hydra-ens " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    if name in distillation.EXPERIMENTS:
        summary = distillation.EXPERIMENTS[name](seeds, out, command=command)
    else:
        task = TASKS[name]("quick" if args.quick else "full")
        cache = (args.cache or cache_dir() / "bench") / ("quick" if args.quick else "full")
        summary = distillation.benchmark_experiment(
            task, seeds, out, cache, command=command, progress=not args.quiet, head_layers=args.head_layers
        )
    print((out / f"{summary['experiment']}.md").read_text())
    print(f"wrote {out}/ in {summary['wall_time_s'] / 60:.1f} min")
    return 0


def _amp(args: argparse.Namespace) -> int:
    task = _task(args, AMP[args.task])
    seeds = _seeds(args)
    out = args.out or Path("benchmarks") / "results" / (args.task + _suffix(args))
    cache = (args.cache or cache_dir() / "bench") / ("quick" if args.quick else "full")
    epochs = args.recovery_epochs if args.recovery_epochs is not None else amp.AMP_RECOVERY.epochs
    recovery = amp.AMP_RECOVERY.with_(epochs=epochs)
    with _records(args, cache, task) as go_on:
        if not go_on:
            return 0
        summary = amp.experiment(
            task,
            seeds,
            out,
            cache,
            command="hydra-ens " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
            deltas=args.deltas,
            flops_target=args.flops_target,
            recovery=recovery,
            progress=not args.quiet,
            tables=args.tables,
            latency_seeds=args.latency_seeds,
        )
    print((out / "amp.md").read_text())
    print(f"wrote {out}/ in {summary['wall_time_s'] / 60:.1f} min")
    return 0


def _zero_shot(args: argparse.Namespace) -> int:
    task = zero_shot.TASKS[args.task]("quick" if args.quick else "full")
    seeds = _seeds(args)
    out = args.out or Path("benchmarks") / "results" / (args.task + ("-quick" if args.quick else ""))
    cache = (args.cache or cache_dir() / "bench") / ("quick" if args.quick else "full")
    command = "hydra-ens " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    summary = runner.run(task, zero_shot.TABLE, seeds, out, cache, command=command, progress=not args.quiet)
    print((out / "table.md").read_text())
    print(f"wrote {out}/ in {summary['wall_time_s'] / 60:.1f} min")
    return 0
