"""Circuit extraction: rank heads by greedy removal on ID and OOD validation data (paper 000, Alg. 1).

At each step the head whose removal keeps the criterion S highest is removed ("avg": the mean of ID accuracy and
the AUROC of MSP separating ID from OOD). Writes circuit.json (the removal order and S after each step). The
search state is saved after every step in circuit_state.json: an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import argparse

from ..adapters import get_adapter
from ..importance import extract_circuit
from ..importance.circuit import CRITERIA, METHODS
from .common import (
    add_data_options,
    add_output_options,
    check_model_dir,
    data_settings,
    fingerprint_path,
    load_predictor,
    model_config,
    read_data,
    start_step,
)

EXAMPLE = "hydra-ens circuit --model my-classifier --data val.csv --ood ood-val.txt --budget 48 --out circuit"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a fine-tuned HF classifier directory")
    parser.add_argument("--data", required=True, help="labelled ID validation data")
    parser.add_argument("--ood", help="OOD validation data (needed by the ood and avg criteria); never test data")
    parser.add_argument("--criterion", choices=sorted(CRITERIA), default="avg")
    parser.add_argument(
        "--budget",
        type=int,
        help="heads to rank by removal (default: two thirds of all heads, the pool `members` draws a third from)",
    )
    parser.add_argument(
        "--method",
        choices=sorted(METHODS),
        default="fast",
        help="fast (exact, default), reference (exact, slow), screen / lazy / multi (approximate)",
    )
    parser.add_argument(
        "--top",
        type=int,
        default=8,
        help="candidates scored exactly per step by screen / lazy; heads removed per step by multi",
    )
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="bf16: score candidates under bfloat16 autocast (faster on CPUs with AMX; approximate)",
    )
    add_output_options(parser)
    add_data_options(parser)


def run(args: argparse.Namespace) -> int:
    model_dir = check_model_dir(args.model)
    settings = {
        "model": fingerprint_path(model_dir, "--model"),
        "data": fingerprint_path(args.data, "--data"),
        "ood": fingerprint_path(args.ood, "--ood") if args.ood else None,
        **{k: getattr(args, k) for k in ("criterion", "budget", "method", "top", "precision")},
        **data_settings(args),
    }
    out = start_step(args, "circuit", settings, "circuit.json")
    if out is None:
        return 0
    model = load_predictor(model_dir)
    config = model_config(model)
    id_data = read_data(args, args.data, model_dir, config, labelled=True, flag="--data")
    if CRITERIA[args.criterion].needs_ood and not args.ood:
        raise ValueError(f"criterion {args.criterion!r} needs OOD validation data: pass --ood PATH.")
    ood_data = read_data(args, args.ood, model_dir, config, labelled=False, flag="--ood") if args.ood else None
    heads = get_adapter(model).num_layers(model) * get_adapter(model).num_heads(model)
    budget = args.budget if args.budget is not None else 2 * (heads // 3)  # members' default pool (paper: 100 of 144)
    state = out.path / "circuit_state.json"
    if state.exists():
        print(f"resuming from {state}")
    circuit = extract_circuit(
        model,
        id_data.batches,
        ood_data.batches if ood_data else None,
        args.criterion,
        budget,
        method=args.method,
        top=args.top,
        precision=args.precision,
        state_path=state,
        progress=not args.quiet,
    )
    circuit.save(out.path / "circuit.json")
    out.finish(
        {
            "removed": [list(h) for h in circuit.removed],
            "baseline": circuit.baseline,
            "final": circuit.scores[-1],
            "search": circuit.search,
        }
    )
    search = "exact search" if circuit.search == "exact" else f"approximate search {circuit.search}"
    print(
        f"removed {len(circuit.removed)} heads ({search}); S ({args.criterion}) {circuit.baseline:.4f} -> "
        f"{circuit.scores[-1]:.4f} -> {out.path}/circuit.json"
    )
    print(f"  removal order (layer, head): {circuit.removed[:12]}{' ...' if len(circuit.removed) > 12 else ''}")
    return 0
