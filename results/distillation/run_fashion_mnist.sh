#!/bin/bash
# Every run behind results/distillation/fashion_mnist.md, one after another, seeds interleaved.
# Usage (repository root, package installed: make demo or pip install -e .): RUNS=/path/to/runs TEACHER=/path/to/teacher_run bash results/distillation/run_fashion_mnist.sh
# TEACHER is the run of `kdcollapse train --config configs/fashion_mnist/teacher.yaml` (convnet, 93.04 %,
# results/fashion_mnist_teacher/). Protocol: the recipes in configs/fashion_mnist/ on 500 training images
# per class, 12 epochs; one thread per run.
set -euo pipefail
RUNS=${RUNS:?set RUNS} TEACHER=${TEACHER:?set TEACHER}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
for seed in 0 1 2; do
  for recipe in student kd dkd dhkd ikl_kd ce_binarykl binarykl_only; do
    if [ $recipe = student ]; then cmd=(train); else cmd=(distill teacher.checkpoint=$TEACHER); fi
    python -m kdcollapse "${cmd[@]}" --config configs/fashion_mnist/$recipe.yaml run_dir=$RUNS/$recipe/seed$seed \
      seed=$seed data.train_per_class=500 train.epochs=12 train.progress=false --overwrite
  done
done
python results/distillation/summarise_fashion_mnist.py "$RUNS" results/distillation
