"""`hydra-ens`: the Hydra Ensembles workflow from the command line, one sub-command per step.

hydra-ens finetune  --model BASE --data train.csv --val val.csv --out single
hydra-ens amp       --model single --data val.csv --delta-e 0.01 --out amp   # optional: adaptive MLP pruning
hydra-ens scores    --model single --data val.csv --out scores            # Taylor head importance
hydra-ens circuit   --model single --data val.csv --ood ood-val.txt --out circuit
hydra-ens members   --model single --scores scores --out members          # or --circuit circuit
hydra-ens finetune  --model members --data train.csv --out members-tuned
hydra-ens fuse      --members members-tuned --data val.csv --out hydra   # prints how far from its members
hydra-ens evaluate  --model single --model hydra --data test.csv --ood ood.txt --out report
hydra-ens distill   --teacher hydra --model single --data train.csv --val val.csv --out student   # optional
hydra-ens calibrate --model hydra --val val.csv --out calibrated           # optional: temperature scaling
hydra-ens ood       --model hydra --data train.csv --out hydra-ood          # optional: feature-space OOD detectors
hydra-ens predict   --model hydra --inputs new.txt --calibration val.csv
hydra-ens export    hydra hydra.onnx                                   # optional: an ONNX graph of it
hydra-ens demo      # all of it on the packaged MiniLM and BBC News
"""

from __future__ import annotations

import argparse
import os
import sys

from PIL.Image import DecompressionBombError
from safetensors import SafetensorError

from ..adapters import UnsupportedModelError
from ..bench.datasets.debian import DataFetchError
from ..io import unreadable_weights
from . import (
    amp,
    bench,
    calibrate,
    circuit,
    demo,
    distill,
    evaluate,
    export,
    finetune,
    fuse,
    members,
    ood,
    predict,
    scores,
)
from .common import CommandError, HelpFormatter

USER_ERRORS = (  # what bad input raises: said in one line. OSError: a file that cannot be read (permissions, a
    CommandError,  # model directory without its weights); SafetensorError: weights that are no safetensors file
    UnsupportedModelError,  # (a Git LFS pointer); DecompressionBombError: an image too large to decode safely
    DataFetchError,
    ValueError,
    OSError,
    SafetensorError,
    DecompressionBombError,
)
COMMANDS = (
    finetune,
    amp,
    scores,
    circuit,
    members,
    fuse,
    evaluate,
    distill,
    calibrate,
    ood,
    predict,
    export,
    bench,
    demo,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hydra-ens", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"hydra-ensembles {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        name = command.__name__.rsplit(".", 1)[-1]
        summary, _, details = command.__doc__.strip().partition("\n\n")
        cmd = sub.add_parser(
            name,
            help=summary,
            description=summary + ("\n\n" + details if details else ""),
            epilog="example:\n  " + command.EXAMPLE.strip().replace("\n", "\n  "),
            formatter_class=HelpFormatter,
        )
        command.add_arguments(cmd)
        cmd.add_argument("--quiet", action="store_true", help="no progress bars")
        cmd.set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        return args.run(args) or 0
    except USER_ERRORS as error:
        if os.environ.get("HYDRA_ENS_DEBUG"):
            raise
        message = " ".join(str(error).split())  # one line
        if isinstance(error, SafetensorError):  # read where no reader names the file (io.reading_dir does)
            message = " ".join(str(unreadable_weights(error, "")).split())
        print(f"hydra-ens {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nhydra-ens {args.command}: interrupted; run the same command again to resume.", file=sys.stderr)
        return 130


def _version() -> str:
    from ..version import __version__

    return __version__


if __name__ == "__main__":
    sys.exit(main())
