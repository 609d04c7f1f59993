#!/usr/bin/env bash
# Install, then run one benchmark table: bash scripts/bench.sh text|image [--quick] [--seeds 0 1 2]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
hydra-ens bench "$@"
