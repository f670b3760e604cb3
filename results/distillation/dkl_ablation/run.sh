#!/bin/bash
# The DKL paper's Table 1 ablation (KD task) at K = 10 and K = 100.
# Usage (repository root): RUNS=/path/to/runs bash results/distillation/dkl_ablation/run.sh [WORKERS]
# Trains the teachers (results/distillation/teachers.sh) into RUNS if they are missing.
set -euo pipefail
RUNS=${RUNS:?set RUNS} WORKERS=${1:-2} SEEDS=${SEEDS:-"0 1 2"}
HERE=results/distillation/dkl_ablation
export OMP_NUM_THREADS=1 PYTHONPATH=${PYTHONPATH:-$PWD/src}
PY=${PY:-python}
RUNS=$RUNS PY=$PY bash results/distillation/teachers.sh
bash $HERE/jobs.sh "$RUNS" "$SEEDS" > $RUNS/dkl_jobs.txt
PY=$PY bash results/distillation/workers.sh $RUNS/dkl_jobs.txt $RUNS/dkl_worker $WORKERS
$PY $HERE/summarise.py $RUNS $HERE
