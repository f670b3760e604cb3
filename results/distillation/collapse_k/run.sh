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
# Teachers (convnet_small, short and subsetted: see README.md). Their runs also serve results/distillation/dkd_beta.
[ -f $RUNS/teacher_k10/model.safetensors ] || $PY -m kdcollapse train --config configs/fashion_mnist/teacher.yaml \
  run_dir=$RUNS/teacher_k10 model.name=convnet_small seed=0 data.train_per_class=300 data.val_per_class=30 \
  data.test_per_class=100 data.batch_size=64 train.epochs=5 train.progress=false --overwrite
[ -f $RUNS/teacher_k100/model.safetensors ] || $PY -m kdcollapse train --config configs/fashion_mnist_pairs/teacher.yaml \
  run_dir=$RUNS/teacher_k100 model.name=convnet_small seed=0 data.train_per_class=50 data.val_per_class=5 \
  data.test_per_class=10 data.batch_size=64 train.epochs=5 train.progress=false --overwrite
bash $HERE/jobs.sh "$RUNS" "$SEEDS" > $RUNS/collapse_jobs.txt
for w in $(seq 0 $((WORKERS - 1))); do
  sleep $((w * 3))  # staggered, so that claims do not race on start-up
  $PY results/distillation/run_queue.py $RUNS/collapse_jobs.txt > $RUNS/collapse_worker$w.log 2>&1 &
done
wait
$PY $HERE/summarise.py $RUNS $HERE
