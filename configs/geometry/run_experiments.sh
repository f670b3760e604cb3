#!/usr/bin/env bash
# Every training run behind results/geometry/heads.md and results/geometry/assignment.md, one after the
# other, then the report. Usage: configs/geometry/run_experiments.sh RUNS_DIR [OUT_DIR]
# (single thread each: OMP_NUM_THREADS=1; about 1 h on one core of a 2-core AMD EPYC shared machine).
set -euo pipefail
runs=${1:?usage: run_experiments.sh RUNS_DIR [OUT_DIR]}
out=${2:-results/geometry}
train() { python -m kdcollapse train train.progress=false "$@"; }

for head in linear cosine cmf; do
  train --config configs/geometry/fmnist_heads.yaml method.head=$head run_dir=$runs/heads/$head --seeds 0,1
done
train --config configs/geometry/fmnist_assignment.yaml run_dir=$runs/assignment/trainable --seeds 0,1,2
for spec in "A1 [0, 1, 2, 3]" "A2 [0, 1, 3, 2]" "A3 [0, 2, 1, 3]"; do
  name=${spec%% *}
  train --config configs/geometry/fmnist_assignment.yaml method.head=fixed method.code=softmax \
    "method.assignment=${spec#* }" run_dir=$runs/assignment/$name --seeds 0,1,2
done
python -m kdcollapse geometry heads-report --runs "$runs" --out "$out"
