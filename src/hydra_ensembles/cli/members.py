"""Members: M pruned copies of a model, made diverse by a pruning seed (paper 000, §4.3, §B.5).

From Taylor scores (--scores): each member prunes --budget heads in every layer, drawn from that layer's --pool
least useful. From a circuit (--circuit): each member prunes --budget heads in the whole model, drawn from the
first --pool heads of the removal order; with --trunk K, members identical in their first K layers (fused, those
run once: fuse them first, `fuse --finetune-train`, so that fine-tuning keeps them one copy). Defaults (the
paper's 48 of 144 heads, drawn from the least useful): a third of the heads, from a pool of twice as many.
Members are always distinct; settings that would give identical members are refused (--allow-identical makes
them anyway). Writes members.json (every member's kept heads) and member0/, member1/, ... (HF checkpoints that
`load_model` restores). Fine-tune them with `hydra-ens finetune --model <this dir>`.

A joint circuit of a two-tower model (`circuit --classes ...`): the members are zero-shot — no fine-tuning —
so this writes model/, the zero-shot Hydra Ensemble itself (each tower's members fused), for `evaluate` and
`predict`; the classes and templates are the circuit's unless --classes / --templates are given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import safetensors.torch
import torch
from safetensors import SafetensorError

from ..adapters import get_adapter
from ..importance import Circuit, JointCircuit
from ..io import read_json_record, write_json_atomic
from ..members import build_members, sample_members
from ..predictors import (
    TwoTowerModel,
    copy_preprocessor,
    describe_saved,
    save_predictor,
    saved_kind,
    zero_shot_ensemble,
)
from ..predictors.classifier import copy_tower_preprocessors, prompt_tokenizer
from ..predictors.clip_zero_shot import DEFAULT_TEMPLATES
from ..pruning import kept_heads
from .common import CommandError, add_zero_shot_options, check_one_model, classifier_at, zero_shot_options
from .step import MEMBERS_FILE, RECORD, add_output_options, check_model_dir, fingerprint_path, start_step

EXAMPLE = """hydra-ens members --model my-classifier --scores scores --num-members 3 --budget 6 --pool 8 --out members
hydra-ens members --model my-classifier --circuit circuit --budget 24 --pool 48 --out members-circ
hydra-ens members --model my-classifier --circuit circuit --trunk 6 --out members-trunk  # first 6 layers shared"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="the HF classifier the members are pruned from")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--scores", help="output of `hydra-ens scores` (directory or scores.safetensors)")
    source.add_argument("--circuit", help="output of `hydra-ens circuit` (directory or circuit.json)")
    parser.add_argument("--num-members", type=int, default=3, help="M, the number of members")
    parser.add_argument(
        "--budget",
        type=int,
        help="heads each member prunes: per layer with --scores, in all with --circuit "
        "(default: a third of a layer's heads / of all heads)",
    )
    parser.add_argument(
        "--pool", type=int, help="least useful heads to draw from (default: twice the budget, at most all ranked)"
    )
    parser.add_argument("--seed", type=int, default=0, help="pruning seed")
    parser.add_argument(
        "--trunk",
        type=int,
        default=0,
        metavar="K",
        help="with --circuit: members identical in their first K layers (the heads the circuit's first --budget "
        "keep there), different after; fused first (fuse --finetune-train) those layers run once, a cheaper "
        "ensemble",
    )
    parser.add_argument(
        "--allow-identical", action="store_true", help="accept identical members (refused by default: no diversity)"
    )
    add_output_options(parser)
    add_zero_shot_options(parser)


def run(args: argparse.Namespace) -> int:
    model_dir = check_model_dir(args.model)
    check_one_model(model_dir, "members", two_tower=True)
    source_path = _source_file(args.scores or args.circuit, "scores.safetensors" if args.scores else "circuit.json")
    settings = {
        "model": fingerprint_path(model_dir, "--model"),
        "source": fingerprint_path(source_path, "--scores" if args.scores else "--circuit"),
        **{k: getattr(args, k) for k in ("num_members", "budget", "pool", "seed", "allow_identical")},
        **({"trunk": args.trunk} if args.trunk else {}),  # absent at 0: earlier runs' settings still match
        "zero_shot": vars(zero_shot_options(args)),
    }
    source = _read_source(source_path, bool(args.scores))  # bad input refused before the step starts
    _warn_if_made_from_another_model(source_path, settings["model"], "--scores" if args.scores else "--circuit")
    out = start_step(args, "members", settings)
    if out is None:
        return 0
    if isinstance(source, JointCircuit):
        return _zero_shot_members(args, out, model_dir, source_path, source)
    model = classifier_at(model_dir, zero_shot=zero_shot_options(args))
    _check_fits(model, source, f"--scores {args.scores}" if args.scores else f"--circuit {args.circuit}")
    head_maps = _sample(args, source)
    write_members(out.path, model_dir, head_maps, {"source": "scores" if args.scores else "circuit"})
    for index, head_map in enumerate(head_maps):
        target = out.path / f"member{index}"
        if not target.exists():  # a rerun after an interruption keeps the members already written (each whole)
            member = build_members(model, [head_map], allow_identical=True)[0]  # distinct: checked above
            save_predictor(member, target, also=lambda folder: copy_preprocessor(model_dir, folder))
        kept = sum(len(heads) for heads in head_map.values())
        print(f"member{index}: keeps {kept} heads, per layer {[len(h) for h in head_map.values()]}")
    out.finish({"members": len(head_maps)})
    print(f"wrote {len(head_maps)} members -> {out.path}")
    return 0


def _zero_shot_members(args: argparse.Namespace, out, model_dir: Path, source_path: Path, circuit: JointCircuit) -> int:
    """Members from a joint circuit of a two-tower model: the zero-shot ensemble, written to out/model."""
    if saved_kind(model_dir) != TwoTowerModel.kind:
        raise CommandError(
            f"--circuit {str(source_path)!r} is a joint (two-tower) circuit; --model must be the "
            "two-tower checkpoint it was extracted from."
        )
    record = source_path.parent / RECORD
    made = read_json_record(record).get("results", {})
    zero_shot = zero_shot_options(args)
    classes, templates = zero_shot.classes or made.get("classes"), zero_shot.templates or made.get("templates")
    if not classes:
        raise CommandError("name the classes with --classes (the circuit's record does not say them).")
    members = _sample(args, circuit)
    image, text = [m["image"] for m in members], [m["text"] for m in members]
    two_tower = TwoTowerModel.from_pretrained(model_dir)
    ensemble = zero_shot_ensemble(
        two_tower, classes, prompt_tokenizer(model_dir), templates or list(DEFAULT_TEMPLATES), image, text
    )
    save_predictor(ensemble, out.path / "model", also=lambda folder: copy_tower_preprocessors(model_dir, folder))
    for index, (image_counts, text_counts) in enumerate(ensemble.head_counts()):
        print(f"member{index}: keeps {image_counts} image and {text_counts} text heads")
    out.finish({"model_dir": "model", "members": len(members), "classes": classes})
    print(f"wrote a zero-shot Hydra Ensemble of {len(members)} members -> {out.path}/model")
    return 0


def _check_fits(model, source, given: str) -> None:
    """Scores or a circuit of another model's shape would give head maps that leave layers out (kept whole,
    silently) or name heads the model does not have: refused, naming both shapes."""
    kept = kept_heads(model)
    if isinstance(source, Circuit):
        theirs = {int(layer): sorted(int(h) for h in heads) for layer, heads in source.kept.items()}
        if theirs != kept:
            raise CommandError(
                f"{given} was extracted from a model with other heads ({sum(map(len, theirs.values()))} in "
                f"{len(theirs)} layers) than --model ({sum(map(len, kept.values()))} in {len(kept)}): extract the "
                "circuit from this model."
            )
        return
    adapter = get_adapter(model)
    shape = (adapter.num_layers(model), adapter.num_heads(model))
    fits = tuple(source.shape) == shape
    scored = (
        {layer: [h for h in range(shape[1]) if not source[layer, h].isnan()] for layer in range(shape[0])}
        if fits
        else {}
    )
    if not fits or scored != kept:
        raise CommandError(
            f"{given} scores a model of shape {tuple(source.shape)} (layers, heads)"
            + ("" if not fits else f" with {sum(map(len, scored.values()))} heads kept")
            + f", but --model has {shape} with {sum(map(len, kept.values()))} kept: score this model "
            "(hydra-ens scores)."
        )


def _sample(args: argparse.Namespace, source) -> list:
    """`sample_members` with the command's flags; its refusals as command errors that name the flag."""
    if args.trunk and not isinstance(source, Circuit):
        raise CommandError("--trunk takes members from a circuit (--circuit, of one model): give it a circuit.")
    try:
        return sample_members(
            source,
            num_members=args.num_members,
            budget=args.budget,
            pool=args.pool,
            seed=args.seed,
            allow_identical=args.allow_identical,
            trunk=args.trunk,
        )
    except ValueError as error:
        said = str(error).replace("allow_identical=True", "--allow-identical")
        raise CommandError(said.replace("a trunk of", "--trunk: a trunk of")) from None


def write_members(path: Path, base: Path, head_maps: list[dict], extra: dict) -> None:
    write_json_atomic(
        path / MEMBERS_FILE,
        {
            "base_model": str(base.resolve()),
            "members": [f"member{i}" for i in range(len(head_maps))],
            "head_maps": [{str(layer): heads for layer, heads in h.items()} for h in head_maps],
            **extra,
        },
    )


def member_dirs(path: str | Path, flag: str) -> list[Path]:
    """The member checkpoints listed in a members directory's members.json."""
    path = Path(path)
    index = path / MEMBERS_FILE
    if not index.is_file():
        raise CommandError(f"{flag} {str(path)!r} is not a members directory (no {MEMBERS_FILE}){_what_it_is(path)}.")
    names = json.loads(index.read_text())["members"]
    missing = [name for name in names if not (path / name / "config.json").is_file()]
    if missing:
        raise CommandError(f"{flag} {str(path)!r} lacks member(s) {missing}: rerun the command that wrote it.")
    return [path / name for name in names]


def _what_it_is(path: Path) -> str:
    """What a directory that is not a members directory holds instead, and what to do about it."""
    try:
        saved = describe_saved(check_model_dir(path))
    except (CommandError, ValueError):
        return "; make one with hydra-ens members"
    return f": it is {saved}; hydra-ens members makes a members directory from one model"


def _read_source(path: Path, scores: bool) -> torch.Tensor | Circuit | JointCircuit:
    """The head scores (L, H) of `scores`, or the circuit (a joint one for a two-tower model) of `circuit`."""
    flag, maker = ("--scores", "hydra-ens scores") if scores else ("--circuit", "hydra-ens circuit")
    try:
        if scores:
            return safetensors.torch.load_file(path)["scores"]
        data = json.loads(path.read_text())  # read once: the kind of circuit is in its kept heads
        joint = isinstance(data["kept"], dict) and "image" in data["kept"]
        return (JointCircuit if joint else Circuit).from_dict(data)
    except (SafetensorError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as error:
        raise CommandError(
            f"{flag} {str(path)!r} is not what {maker} writes ({type(error).__name__}: {error}); give that "
            "step's output directory."
        ) from None


def _warn_if_made_from_another_model(source_path: Path, model: dict, flag: str) -> None:
    """Scores or a circuit of another model of the same shape would be taken without a word: say so when the step
    that made them (its record beside them) read another --model, or this one before its files changed."""
    made_from = read_json_record(source_path.parent / RECORD).get("settings", {}).get("model")
    if not isinstance(made_from, dict) or made_from == model:
        return
    how = "its files changed since" if made_from.get("path") == model["path"] else f"not {model['path']!r}"
    print(
        f"warning: {flag} {str(source_path.parent)!r} was made from the model at {made_from.get('path')!r} ({how}): "
        "its heads rank that model's; rerun that step on this --model if it is another model.",
        file=sys.stderr,
    )


def _source_file(path: str, name: str) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / name
    if not path.is_file():
        raise CommandError(f"no {name} at {str(path)!r}: give the output directory of the step that made it.")
    return path
