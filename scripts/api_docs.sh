#!/usr/bin/env bash
# Install, then build the API reference from the docstrings into docs/api/ (open docs/api/index.html).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
python docs/build_api.py docs/api
