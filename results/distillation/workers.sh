#!/bin/bash
# Runs a job list with WORKERS run_queue.py processes side by side (one thread each) and waits for them.
# Usage (repository root): bash results/distillation/workers.sh JOBS LOG_PREFIX WORKERS   (PY: the python to use)
set -euo pipefail
JOBS=$1 LOG=$2 WORKERS=${3:-2} PY=${PY:-python}
export OMP_NUM_THREADS=1
for w in $(seq 0 $((WORKERS - 1))); do
  sleep $((w * 3))  # staggered, so that claims do not race on start-up
  $PY results/distillation/run_queue.py $JOBS > ${LOG}$w.log 2>&1 &
done
wait
