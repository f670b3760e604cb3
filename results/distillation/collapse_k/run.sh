#!/bin/bash
# DHKD App. A (Tables 6-7) at K = 10 and K = 100: does CE + BinaryKL on one head collapse, and why?
# Usage (repository root): RUNS=/path/to/runs bash results/distillation/collapse_k/run.sh [WORKERS]
# Trains the two teachers if missing, then every job of jobs.txt (WORKERS processes, default 2, one thread
# each), then summarise.py. Re-running skips finished runs (run_queue.py). SEEDS="0 1 2" by default.
set -euo pipefail
RUNS=${RUNS:?set RUNS} WORKERS=${1:-2} SEEDS=${SEEDS:-"0 1 2"}
HERE=results/distillation/collapse_k
export OMP_NUM_THREADS=1 PYTHONPATH=${PYTHONPATH:-$PWD/src}
PY=${PY:-python}
RUNS=$RUNS PY=$PY bash results/distillation/teachers.sh  # also the teachers of dkd_beta and dkl_ablation
bash $HERE/jobs.sh "$RUNS" "$SEEDS" > $RUNS/collapse_jobs.txt
PY=$PY bash results/distillation/workers.sh $RUNS/collapse_jobs.txt $RUNS/collapse_worker $WORKERS
$PY $HERE/summarise.py $RUNS $HERE
