#!/usr/bin/env bash
# The second core's runs (queue.sh is the first core's): sentiment-mpnet seed 0 and its extras first (its circuit
# is recorded, all 96 removals, 2026-11-26: the line trains CircAvg, Hydra (Circ) and their calibrated rows), then the
# main rows of sentiment-mpnet's seeds 1-2, sentiment-mpnet's cost curve (issue 44), the extras (issue 42; image-dinov2's seeds 1-2 moved to queue.sh)
# (issue 39). Resumes like queue.sh; never run a line while the
# other queue trains the same task and seed (they share its cache). E.g.
#   OMP_NUM_THREADS=1 nohup taskset -c 1 bash benchmarks/records/queue-core1.sh > queue-core1.log 2>&1 &
set -euo pipefail
cd "${HYDRA_REPO:-$(dirname "$0")/../..}"
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
R=benchmarks/records
set -x
# with issue 39 item 5's rows (exact stacking, fusing first, against the averaged MLP) and CircAvg calibrated
# seed 0's variants (stacked, fused then fine-tuned, calibrated CircAvg: issue 39 item 5 on one seed) in seed0-variants/
hydra-ens bench sentiment-mpnet --seeds 0 --records $R --quiet --out benchmarks/results/text-sentiment-all-mpnet-base-v2/seed0-variants --rows Single CircAvg "Hydra (Circ)" "Deep Ensembles" "Temp. scaling" "Hydra (Circ), temp. scaling" "Hydra (Circ), stacked MLP" "Hydra (Circ), fused then fine-tuned" "CircAvg, temp. scaling"
# seed 1's Hydra (Taylor) (issue 39 item 6: its members 0 and 1 were done 2026-11-29); seed 2's runs in queue.sh
# at the same time (one seed each: never one seed in both), which then renders the three-seed table
hydra-ens bench sentiment-mpnet --seeds 1 --records $R --quiet --untimed --out /tmp/hydra-subsets/sentiment-mpnet-seed1-taylor --rows Single "Hydra (Taylor)"
# is sentiment's circuit (60 ID + 80 OOD validation texts) the model's or the sample's? (issue 39 item 1). In fp32:
# the task's bf16 candidates were ~17 s each on the Intel Xeon of 2026-11-29, which emulates bf16 (~7 h a half);
# fp32 runs the same search several times faster there (report circuit-halves-fp32)
python benchmarks/circuit_halves.py sentiment-mpnet --seed 0 --first 12 24 48 --precision fp32
# (issue 39 item 7's protocol ablation runs on core 0: queue.sh)
# issue 41 (moved here from queue.sh, 2026-11-30: hours here, where sentiment's cost curve is days on a CPU that
# emulates bf16): BatchEnsemble and OBA on a text task (BBC, MiniLM), three seeds; Hydra (Circ) of seeds 1-2 after
hydra-ens bench text --seeds 0 1 2 --records $R --quiet --rows Single "Deep Ensembles" BatchEnsemble OBA
hydra-ens bench text --seeds 0 1 2 --records $R --quiet --rows Single "Deep Ensembles" "Hydra (Circ)" BatchEnsemble OBA
# issue 41: image-dinov2's BatchEnsemble on seeds 1 and 2 (seed 0's is queue.sh's; one seed per queue, never one
# seed in both): each trains its seed's Single first on an empty cache (~40 min here), then BatchEnsemble (~3x a
# Single's fine-tuning); a machine whose queues keep separate caches links this task's folder into both
hydra-ens bench image-dinov2 --seeds 1 --records $R --quiet --untimed --out /tmp/hydra-subsets/image-dinov2-seed1-be --rows Single BatchEnsemble
hydra-ens bench image-dinov2 --seeds 2 --records $R --quiet --untimed --out /tmp/hydra-subsets/image-dinov2-seed2-be --rows Single BatchEnsemble
hydra-ens bench sentiment-mpnet --seeds 0 --records $R --quiet --cost-curve
# issue 44: seed 0's Deep Ensembles and Hydra (Circ) distilled into students with 1 and 2 head layers (their teachers
# are this cache's; distill-* keeps no records, so a line runs to its end on one machine or resumes from its cache)
hydra-ens bench distill-sentiment-mpnet --seeds 0 --quiet
hydra-ens bench distill-sentiment-mpnet --seeds 0 --quiet --head-layers 2
# issue 42: the extras of seed 0's Single and Deep Ensembles are done (2026-11-26); these add CircAvg and Hydra (Circ)
python benchmarks/uncertainty_extras.py sentiment-mpnet --seeds 0 --rows Single CircAvg "Hydra (Circ)" "Deep Ensembles" --quiet
# the three-seed table timed on seed 2, whose models the lines above train on this machine
hydra-ens bench sentiment-mpnet --seeds 0 1 2 --records $R --quiet --latency-seeds 2 --rows Single "Deep Ensembles" "Temp. scaling" CircAvg "CircAvg, temp. scaling" "Hydra (Taylor)" "Hydra (Circ)" "Hydra (Circ), temp. scaling"
# issue 44 asks for the students on three seeds: seeds 1 and 2 train their teachers first (hours a seed)
hydra-ens bench distill-sentiment-mpnet --seeds 0 1 2 --quiet
hydra-ens bench distill-sentiment-mpnet --seeds 0 1 2 --quiet --head-layers 2
