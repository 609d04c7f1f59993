"""Build the API reference from the docstrings with pdoc, offline: python docs/build_api.py [OUT_DIR]."""

import subprocess
import sys

MODULES = [
    "hydra_ensembles",
    "hydra_ensembles.adapters",
    "hydra_ensembles.pruning",
    "hydra_ensembles.importance",
    "hydra_ensembles.members",
    "hydra_ensembles.training",
    "hydra_ensembles.fusion",
    "hydra_ensembles.predictors",
    "hydra_ensembles.evaluation",
    "hydra_ensembles.outputs",
    "hydra_ensembles.metrics",
    "hydra_ensembles.uncertainty",
    "hydra_ensembles.data.files",
    "hydra_ensembles.cost",
    "hydra_ensembles.io",
    "hydra_ensembles.distributed",
    "hydra_ensembles.cli",
]

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/api"
    command = [sys.executable, "-m", "pdoc", "--docformat", "google", "--output-directory", out, *MODULES]
    subprocess.run(command, check=True)
    print(f"API reference: {out}/index.html")
