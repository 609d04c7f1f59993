#!/usr/bin/env bash
# The benchmark runs still under way (issue 39: the protocol of OOD validation splits, informative circuits, pools
# twice the budget, validation-selected training), in order. Each goes on from these records on any machine and keeps
# them up to date (--records); a run whose rows are all recorded renders its table from them in seconds, so the
# whole queue can be started again after any stop. One CPU-heavy job per core: this queue on one core,
# queue-core1.sh (the text tasks, sentiment-mpnet, image-dinov2's seeds 1-2) on the other, each with one torch thread
# (OMP_NUM_THREADS=1 taskset -c K); e.g.
#   bash scripts/install.sh --pretrained && OMP_NUM_THREADS=1 nohup taskset -c 0 bash benchmarks/records/queue.sh > queue.log 2>&1 &
# Before a machine goes away: hydra-ens bench <task> --seeds ... --records benchmarks/records --records-only
# (bash reads a script as it runs it: to edit this file meanwhile, run a copy from the repository root:
# `cp benchmarks/records/queue.sh /tmp/q.sh && HYDRA_REPO=$PWD bash /tmp/q.sh`)
set -euo pipefail
cd "${HYDRA_REPO:-$(dirname "$0")/../..}"
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
R=benchmarks/records
set -x
# one command a line: tests/bench/test_records.py parses every `hydra-ens bench` line
# Each machine starts with an empty cache (weights are never recorded): a line retrains what its rows need, from the
# seed (the digests in model_digests.json show the retrained models equal the recorded ones), so lines that share a
# base run one after another in one session. Done and rendering from records: image-dinov2 seed 0's main rows and
# extras, image-fmnist's cheap ensembles and OBA (3 seeds).
# issue 39 before all: sentiment-mpnet's Hydra (Taylor) of seed 2 (moved here from queue-core1.sh, 2026-11-29,
# which trains seed 1's meanwhile: two seeds of one cache at once, never one seed twice; a machine whose queues keep
# separate caches links this task's folder into this queue's cache: its models are queue-core1.sh's), then the
# three-seed table issue 39 closes on (seed 1's members, ~3 h ahead of seed 2's, are done by then), untimed
hydra-ens bench sentiment-mpnet --seeds 2 --records $R --quiet --untimed --out /tmp/hydra-subsets/sentiment-mpnet-seed2-taylor --rows Single "Hydra (Taylor)"
hydra-ens bench sentiment-mpnet --seeds 0 1 2 --records $R --quiet --untimed --out benchmarks/results/text-sentiment-all-mpnet-base-v2/seeds012 --rows Single "Deep Ensembles" "Temp. scaling" CircAvg "CircAvg, temp. scaling" "Hydra (Taylor)" "Hydra (Circ)" "Hydra (Circ), temp. scaling"
# image-dinov2 at 84 px (chosen on validation over 56 px: benchmarks/results/image-dinov2/resolution.md; 112 px was
# left out for cost: ~4x 56 px a step, ~12 h a seed's rows on 2 cores)
# issue 41: OBA on the 12-layer ViT (paper 000 Table 1 has it on ImageNet); then issue 44's cost/quality curve on
# seed 0's base (CircAvg and it calibrated, OBA, the shared trunks, fused then fine-tuned, Hydra (Circ), Deep
# Ensembles), each row's validation numbers and its choice at a cost limit; it reuses the Single and OBA trained here
# issue 39 first: seeds 1 and 2 of image-dinov2 on the rows the closing questions need (moved here from
# queue-core1.sh, 2026-11-27: that core has sentiment-mpnet's seeds 1-2 ahead of them for several sessions)
# (one seed's runs write their table to /tmp: benchmarks/results/image-dinov2/table.md is the table of every seed)
hydra-ens bench image-dinov2 --seeds 1 --records $R --quiet --untimed --out /tmp/hydra-subsets/image-dinov2-seed1 --rows Single CircAvg "Hydra (Circ)" "Deep Ensembles" "Temp. scaling" "Hydra (Circ), temp. scaling"
hydra-ens bench image-dinov2 --seeds 2 --records $R --quiet --untimed --out /tmp/hydra-subsets/image-dinov2-seed2 --rows Single CircAvg "Hydra (Circ)" "Deep Ensembles" "Temp. scaling" "Hydra (Circ), temp. scaling"
# the three-seed table issue 39 closes on: Hydra (Taylor) beside Hydra (Circ) (item 6), the control trained as long
# (item 4). Seed 2's Hydra (Taylor) is what is left (2026-11-29: the machine started with an empty cache, so its
# Single is trained again first); the three-seed table untimed (timing seed 2 would train its other six models
# again, ~5 h; the recorded seed-2 latency covers the rows of seeds012-control), into seeds012/
hydra-ens bench image-dinov2 --seeds 2 --records $R --quiet --out /tmp/hydra-subsets/image-dinov2-seed2-taylor --rows Single "Hydra (Taylor)"
hydra-ens bench image-dinov2 --seeds 0 1 2 --records $R --quiet --untimed --out benchmarks/results/image-dinov2/seeds012 --rows Single "Single, trained as long" "Deep Ensembles" "Temp. scaling" CircAvg "Hydra (Taylor)" "Hydra (Circ)" "Hydra (Circ), temp. scaling"
# then issue 39's other two measurements: is the circuit the model's (two disjoint halves of the validation
# data), and which protocol change moved what (seed 0, about an hour a step on 2 cores)
python benchmarks/circuit_halves.py image-dinov2 --seed 0 --first 12 24 48  # is the circuit the model's?
# step 4 is this cache's seed 0 rows; steps 0-3 (own caches, ~10 h) follow here (moved from queue-core1.sh,
# 2026-11-29: that core has sentiment-mpnet's Hydra (Taylor) on three seeds ahead, ~11 h). ablation.md renders
# every step whose table sits in results/image-dinov2/ablation/, from the records in seconds
python benchmarks/protocol_ablation.py --seed 0 --steps 4
python benchmarks/protocol_ablation.py --seed 0 --steps 0 1 2 3
# issue 41 and 44 on seed 0's base
hydra-ens bench image-dinov2 --seeds 0 --records $R --quiet --untimed --out benchmarks/results/image-dinov2/oba --rows Single "Single, trained as long" CircAvg "Hydra (Circ)" OBA
hydra-ens bench image-dinov2 --seeds 0 --records $R --quiet --cost-curve
hydra-ens bench image-dinov2 --seeds 0 --records $R --quiet --rows Single BatchEnsemble Taylor "Hydra (Taylor)" "Hydra (Circ), fused then fine-tuned"
# issue 44 (circuits a user can afford): each approximate search against seed 0's exact ranking (cached), timed
python benchmarks/circuit_approx.py image-dinov2 --seed 0 --methods fast:bf16 multi-2 multi-4 multi-4:bf16 multi-8
# issue 44: seed 0's Deep Ensembles and Hydra (Circ) distilled into students with 1 and 2 head layers
hydra-ens bench distill-image-dinov2 --seeds 0 --quiet
hydra-ens bench distill-image-dinov2 --seeds 0 --quiet --head-layers 2
# issue 44: the AMP base (paper 002) of seed 0's Single at one model's FLOPs, with Single and Hydra on it
hydra-ens bench amp-image-dinov2 --seeds 0 --records $R --quiet --tables free
# issue 41's text rows (BBC, MiniLM): queue-core1.sh
# every row of issue 39's table on three seeds, then the full tables
hydra-ens bench image-dinov2 --seeds 0 1 2 --records $R --quiet --latency-seeds 2 --rows Single "Single, trained as long" "Deep Ensembles" Taylor CircAvg "Hydra (Taylor)" "Hydra (Circ)" "Hydra (Circ), fused then fine-tuned" "Temp. scaling" "Hydra (Circ), temp. scaling" BatchEnsemble
hydra-ens bench image-dinov2 --seeds 0 1 2 --records $R --quiet --latency-seeds 2
# sentiment-mpnet's three-seed table: queue-core1.sh (its models are in that core's cache)
# issue 44 asks for the students on three seeds: seeds 1 and 2 train their teachers first (hours a seed)
hydra-ens bench distill-image-dinov2 --seeds 0 1 2 --quiet
hydra-ens bench distill-image-dinov2 --seeds 0 1 2 --quiet --head-layers 2
