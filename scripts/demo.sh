#!/usr/bin/env bash
# The main job on the embedded default: MiniLM + BBC News, single model vs Hydra Ensembles, report in ./hydra-demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
hydra-ens demo "$@"
