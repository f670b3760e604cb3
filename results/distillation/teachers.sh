#!/bin/bash
# The two teachers of the short distillation studies not yet ported to study files (collapse_*), trained into RUNS
# when missing: convnet_small, seed 0, cosine lr 0.1, batch 64, 5 epochs, on subsets (see collapse_k/README.md).
# Usage (repository root): RUNS=/path/to/runs [PY=python] bash results/distillation/teachers.sh
set -euo pipefail
RUNS=${RUNS:?set RUNS} PY=${PY:-python}
[ -f $RUNS/teacher_k10/model.safetensors ] || $PY -m kdcollapse train --config configs/fashion_mnist/teacher.yaml \
  run_dir=$RUNS/teacher_k10 model.name=convnet_small seed=0 data.train_per_class=300 data.val_per_class=30 \
  data.test_per_class=100 data.batch_size=64 train.epochs=5 train.progress=false --overwrite
[ -f $RUNS/teacher_k100/model.safetensors ] || $PY -m kdcollapse train --config configs/fashion_mnist_pairs/teacher.yaml \
  run_dir=$RUNS/teacher_k100 model.name=convnet_small seed=0 data.train_per_class=50 data.val_per_class=5 \
  data.test_per_class=10 data.batch_size=64 train.epochs=5 train.progress=false --overwrite
