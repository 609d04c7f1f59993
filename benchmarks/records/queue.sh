#!/usr/bin/env bash
# The benchmark runs still under way (issue 12), in order. Each goes on from these records on any machine and keeps
# them up to date (--records); a run whose rows are all recorded renders its table from them in seconds, so the
# whole queue can be started again after any stop. One CPU-heavy job at a time: run it alone, e.g.
#   bash scripts/install.sh --pretrained && nohup bash benchmarks/records/queue.sh > queue.log 2>&1 &
# Before a machine goes away: hydra-ens bench <task> --seeds ... --records benchmarks/records --records-only
set -euo pipefail
cd "$(dirname "$0")/../.."
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
R=benchmarks/records
set -x
# the MPNet tasks' circuit search (multi-4-bf16) against the exact one, on a smaller budget and data (issue 12), on
# sentiment: on BBC (text-mpnet) every one of the first step's 144 candidates leaves S at 1.0, a plateau where every
# search removes heads in (layer, head) order, so agreement there would measure nothing
python benchmarks/circuit_approx.py sentiment-mpnet --seed 0 --batches 2 --budget 16 --methods multi-4:bf16 multi-4
hydra-ens bench sentiment-mpnet --seeds 0 --records $R --records-only
hydra-ens bench sentiment-mpnet --seeds 0 --records $R --quiet
hydra-ens bench text-mpnet --seeds 1 2 0 --records $R --quiet
hydra-ens bench sentiment-mpnet --seeds 0 1 2 --records $R --quiet
