"""Each ensemble against its own members alone: does averaging the members help OOD detection, or lose what each
member detects by itself? From the logits `hydra-ens bench` records (no model is loaded or trained).

For every ensemble row (its logits (N, M, C), M > 1) and seed: the row's all-OOD AUROC by the maximum softmax
probability of the members' mean (what the tables report), by each member alone (its own MSP), and by the two parts
of the predictive entropy: the members' mean entropy (`expected_entropy`, the data part) and their disagreement
(`mutual_information`, the model part); then the paired bootstrap of the ensemble against each member (NLL, ECE, all-OOD
AUROC; resampling the test examples, then the seeds). Every member is compared, none is chosen: the members of a
row are exchangeable draws, and picking the best on the test set would be choosing on it.

    python benchmarks/members_vs_ensemble.py sentiment-mpnet --seeds 0 1 2 --rows "Hydra (Circ)" "Deep Ensembles"

Writes benchmarks/results/<task>/members.md and .json.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from torch import Tensor

from hydra_ensembles.bench import runner
from hydra_ensembles.bench.suite import all_ood_auroc, members_of, recorded_logits
from hydra_ensembles.bench.tasks import TASKS
from hydra_ensembles.evaluation.bootstrap import difference_lines, paired_bootstrap
from hydra_ensembles.io import write_json_atomic, write_text_atomic
from hydra_ensembles.outputs import labels_of

RESULTS = Path(__file__).parent / "results"
RECORDS = Path(__file__).parent / "records"


SCORES = {"ensemble MSP": "msp", "expected entropy": "expected_entropy", "mutual information": "mutual_information"}


def compare_row(runs: Mapping[int, dict], labels: Tensor) -> dict:
    """The row's AUROC by each score and each member's, per seed, and the ensemble against each member."""
    members = runs[next(iter(runs))]["test"].shape[1]
    seeds = list(runs)
    per_seed = {
        seed: {name: 100 * all_ood_auroc(run, labels, score=score) for name, score in SCORES.items()}
        | {f"member {m}": 100 * all_ood_auroc(run, labels, slice(m, m + 1)) for m in range(members)}
        for seed, run in runs.items()
    }
    against = {
        m: paired_bootstrap([runs[s] for s in seeds], [members_of(runs[s], slice(m, m + 1)) for s in seeds], labels)
        for m in range(members)
    }
    against = {m: {metric: i._asdict() for metric, i in intervals.items()} for m, intervals in against.items()}
    return {"seeds": seeds, "members": members, "per_seed": per_seed, "against": against}


def markdown(task: str, command: str, rows: Mapping[str, dict]) -> str:
    lines = [
        f"# {task}: each ensemble against its own members alone",
        "",
        f"Command: `{command}`",
        "",
        "All-OOD AUROC in % (the mean over the OOD test sets), per seed. *Ensemble MSP*: the maximum softmax "
        "probability of the members' mean, what the tables report; *expected entropy*: the members' mean entropy "
        "(the data part of the predictive entropy); *mutual information*: the members' disagreement (its model "
        "part); *member m*: that member alone, by its MSP "
        "(in a Hydra Ensemble, its stream of the fused module: its heads with the merged MLP). Within a row every "
        "value comes from the same logits, so builds of the seed's models do not enter.",
        "",
    ]
    for row, said in rows.items():
        names = [*SCORES, *(f"member {m}" for m in range(said["members"]))]
        lines += [f"## {row}", "", "| seed | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for seed, values in said["per_seed"].items():
            lines.append(f"| {seed} | " + " | ".join(f"{values[name]:.1f}" for name in names) + " |")
        lines.append("")
        pairs = [{"rows": [row, f"its member {m} alone"]} | intervals for m, intervals in said["against"].items()]
        lines += [*difference_lines({"level": 0.95, "resamples": 2000, "seeds": said["seeds"], "pairs": pairs}), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rows", nargs="+", default=["Hydra (Circ)", "Hydra (Taylor)", "Deep Ensembles"])
    parser.add_argument("--records", type=Path, default=RECORDS)
    args = parser.parse_args(argv)
    command = shlex.join(["python", "benchmarks/members_vs_ensemble.py", *(sys.argv[1:] if argv is None else argv)])
    task = TASKS[args.task]("full")
    folders = {seed: args.records / runner.task_key(task) / f"seed{seed}" for seed in args.seeds}
    labels = labels_of(task.test)
    rows = {}
    for row in args.rows:
        runs = recorded_logits(folders, row)
        if not runs:
            print(f"{row}: no recorded logits for seeds {args.seeds} in {args.records}: left out")
            continue
        rows[row] = compare_row(runs, labels)
    out, text = RESULTS / task.name, markdown(task.name, command, rows)
    write_json_atomic(out / "members.json", {"command": command, "rows": rows})
    write_text_atomic(out / "members.md", text)
    print(text)


if __name__ == "__main__":
    main()
