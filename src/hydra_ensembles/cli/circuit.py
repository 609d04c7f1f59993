"""Circuit extraction: rank heads by greedy removal on ID and OOD validation data (paper 000, Alg. 1).

At each step the head whose removal keeps the criterion S highest is removed ("avg": the mean of ID accuracy and
the AUROC of MSP separating ID from OOD). Writes circuit.json (the removal order and S after each step). The
search state is saved after every step in circuit_state.json: an interrupted run resumes where it stopped.

A two-tower (CLIP-style) model with --classes: a joint circuit over both towers' heads (§D.3; --towers image
for the image tower alone), scored on zero-shot logits; `members --circuit` then samples zero-shot members.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..importance import extract_circuit, extract_joint_circuit
from ..importance.circuit import CRITERIA, METHODS
from ..importance.circuit.budget import TimeBudgetExceeded, probe_path, subsample
from ..importance.circuit.record import say_ties
from ..io import without_late_defaults, write_text_atomic
from ..predictors import TwoTowerModel, ZeroShotEnsemble, model_config
from ..predictors.classifier import prompt_tokenizer
from ..predictors.clip_zero_shot import prompt_batches
from .common import (
    CommandError,
    add_data_options,
    add_device_argument,
    add_zero_shot_options,
    check_one_model,
    classifier_at,
    data_settings,
    duration_seconds,
    read_data,
    resolve_device,
    zero_shot_options,
)
from .step import add_output_options, check_model_dir, fingerprint_path, start_step

EXAMPLE = """hydra-ens circuit --model my-classifier --data val.csv --ood ood-val.txt --budget 48 --out circuit
hydra-ens circuit --model clip-dir --classes "cat,dog,car" --data val-photos/ --ood ood-photos/ --out circuit"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a fine-tuned HF classifier directory")
    parser.add_argument("--data", required=True, help="labelled ID validation data")
    parser.add_argument("--ood", help="OOD validation data (needed by the ood and avg criteria); never test data")
    parser.add_argument(
        "--criterion",
        choices=sorted(CRITERIA),
        default="avg",
        help="S, what a removal must keep high: avg = mean of ID accuracy and the MSP AUROC of ID vs OOD, acc, ood",
    )
    parser.add_argument(
        "--budget",
        type=int,
        help="heads to rank by removal (default: two thirds of the heads, the pool `members` draws a third from; "
        "two-tower models: a fifth of the candidate heads)",
    )
    parser.add_argument(
        "--method",
        choices=["auto", *sorted(METHODS)],
        default="auto",
        help="auto: a short timed probe predicts each search's time on this data, and the most accurate that fits "
        "--time-budget runs (fast, exact; then fast in bf16; then multi in bf16 removing 2, 4 or 8 heads per step); "
        "when none fits it stops before starting and names what fits; if the search falls behind, the remaining "
        "removals run a coarser search (with a warning). fast, reference (exact); screen / lazy / multi "
        "(approximate). Two-tower models: auto means fast",
    )
    parser.add_argument(
        "--time-budget",
        default="30m",
        metavar="DURATION",
        help="how long the whole search may take under --method auto, its probe included: a number and its unit, "
        "90s, 30m or 2h",
    )
    parser.add_argument(
        "--max-examples",
        type=int,
        metavar="N",
        help="score on at most N ID and N OOD validation examples, drawn without replacement by --sample-seed "
        "(faster: a search's time is proportional to the examples; default: all)",
    )
    parser.add_argument("--sample-seed", type=int, default=0, help="seed of the --max-examples subsample")
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
        help="bf16: score candidates under bfloat16 autocast (faster on CPUs with AMX or AVX512-BF16; approximate)",
    )
    parser.add_argument(
        "--tie-break",
        choices=("score", "order"),
        default="score",
        help="how candidates that leave the same S are ordered: score (by the criterion's continuous secondary "
        "score, e.g. ID NLL for acc), or order (Algorithm 1 literally: (layer, head) order)",
    )
    parser.add_argument(
        "--towers",
        choices=("image,text", "image"),
        metavar="TOWERS",
        help="two-tower models run zero-shot (--classes): whose heads the circuit ranks, 'image,text' (both, the "
        "default) or 'image'",
    )
    add_output_options(parser)
    add_data_options(parser)
    add_zero_shot_options(parser)
    add_device_argument(parser)


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    time_budget = duration_seconds(args.time_budget, "--time-budget")
    model_dir = check_model_dir(args.model)
    check_one_model(model_dir, "circuit", two_tower=True)
    if CRITERIA[args.criterion].needs_ood and not args.ood:  # before the step starts: nothing loaded, nothing left
        raise CommandError(f"criterion {args.criterion!r} needs OOD validation data: pass --ood PATH.")
    if args.towers is not None and args.classes is None:  # a one-tower model's circuit has no towers to choose
        raise CommandError("--towers applies to a two-tower model run zero-shot (with --classes); drop it here.")
    args.towers = args.towers or "image,text"
    settings = {
        "model": fingerprint_path(model_dir, "--model"),
        "data": fingerprint_path(args.data, "--data"),
        "ood": fingerprint_path(args.ood, "--ood") if args.ood else None,
        # not --time-budget: a run stopped by its budget resumes with a larger one (a changed setting would clear
        # the saved search); a finished circuit stays finished (--force redoes it)
        **{k: getattr(args, k) for k in ("criterion", "budget", "method", "top", "precision", "towers")},
        # steps recorded before these flags ranked by "order", on all the examples: they stay valid for it
        **without_late_defaults(
            {"tie_break": args.tie_break, "max_examples": args.max_examples, "sample_seed": args.sample_seed},
            {"tie_break": "order", "max_examples": None, "sample_seed": 0},
        ),
        "zero_shot": vars(zero_shot_options(args)),
        **data_settings(args),
    }
    kept_probe = _kept_probe(Path(args.out))  # a run refused for time kept its probe; a new --max-examples clears
    out = start_step(args, "circuit", settings, "circuit.json")  # the directory, so carry it over
    if out is None:
        return 0
    if kept_probe is not None:
        write_text_atomic(probe_path(out.path / "circuit_state.json"), kept_probe)
    model = classifier_at(model_dir, zero_shot=zero_shot_options(args)).to(device)
    config = model_config(model)
    id_data = read_data(args, args.data, model_dir, config, labelled=True, flag="--data")
    ood_data = read_data(args, args.ood, model_dir, config, labelled=False, flag="--ood") if args.ood else None
    state = out.path / "circuit_state.json"
    if state.exists():
        print(f"resuming from {state}")
    if isinstance(model, ZeroShotEnsemble):
        return _joint(args, out, model_dir, model, id_data, ood_data, state)
    try:
        circuit = extract_circuit(
            model,
            id_data.batches,
            ood_data.batches if ood_data else None,
            args.criterion,
            args.budget,
            method=args.method,
            time_budget=time_budget,
            max_examples=args.max_examples,
            sample_seed=args.sample_seed,
            top=args.top,
            precision=args.precision,
            tie_break=args.tie_break,
            state_path=state,
            progress=not args.quiet,
        )
    except TimeBudgetExceeded as stopped:
        raise CommandError(str(stopped).replace(" / max_examples", "")) from None
    if circuit.note:
        print(f"search: {circuit.note}")
    extra = {"note": circuit.note, "timing": circuit.timing}
    return _finish(args, out, circuit, extra, "heads", "(layer, head)", 12)


def _kept_probe(out: Path) -> str | None:
    """The probe a search refused for time kept in `out` (`budget.save_probe`: it names the weights it timed, and
    a search reads it only for those), or None."""
    probe = probe_path(out / "circuit_state.json")
    return probe.read_text() if probe.is_file() else None


def _joint(args, out, model_dir, model, id_data, ood_data, state) -> int:
    """A joint circuit of a two-tower model (its checkpoint: `check_one_model` refused a saved ensemble)."""
    towers = tuple(args.towers.split(","))
    two_tower = TwoTowerModel(model.image, model.text, model.logit_scale)  # the checkpoint's own, unpruned towers
    prompts = prompt_batches(prompt_tokenizer(model_dir), model.classes, model.templates, two_tower.text)
    sample = (args.max_examples, args.sample_seed)
    circuit = extract_joint_circuit(
        two_tower,
        subsample(id_data.batches, *sample),
        subsample(ood_data.batches, *sample) if ood_data else None,
        prompts,
        len(model.classes),
        args.criterion,
        args.budget,
        towers=towers,
        method=_joint_method(args),
        top=args.top,
        precision=args.precision,
        tie_break=args.tie_break,
        state_path=state,
        progress=not args.quiet,
    )
    extra = {"joint": True, "classes": model.classes, "templates": model.templates}
    return _finish(args, out, circuit, extra, f"heads of {'+'.join(towers)}", "(tower, layer, head)", 8)


def _joint_method(args) -> str:
    """Joint circuits have no planned search: "auto" runs the exact one, and says that --time-budget does not
    bind it."""
    if args.method != "auto":
        return args.method
    if not args.quiet:
        print(f"joint circuit: the exact search (--method fast); --time-budget {args.time_budget} does not apply to "
              "two-tower models: to spend less, pass --method multi --top K or --max-examples N")  # fmt: skip
    return "fast"


def _finish(args, out, circuit, extra: dict, what: str, order: str, shown: int) -> int:
    """Save circuit.json, record the step's results, and say what was removed, by which search, and how many
    removals tied (the search says so itself unless --quiet)."""
    circuit.save(out.path / "circuit.json")
    out.finish(
        {
            "removed": [list(h) for h in circuit.removed],
            "baseline": circuit.baseline,
            "final": circuit.scores[-1],  # "multi": the last head's S alone on its step's start (record.py)
            "search": circuit.search,
            "ties": circuit.ties,
            **extra,
        }
    )
    search = "exact search" if circuit.search == "exact" else f"approximate search {circuit.search}"
    last = "the last head's, scored alone on its step's start" if circuit.search.startswith("multi") else "final"
    print(
        f"removed {len(circuit.removed)} {what} ({search}); S ({args.criterion}) {circuit.baseline:.4f} -> "
        f"{circuit.scores[-1]:.4f} ({last}) -> {out.path}/circuit.json"
    )
    more = " ..." if len(circuit.removed) > shown else ""
    print(f"  removal order {order}: {circuit.removed[:shown]}{more}")
    if args.quiet:
        say_ties(circuit, "  search")
    return 0
