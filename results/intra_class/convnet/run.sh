#!/bin/sh
# Intra-class teachers where distillation can help: convnet teacher -> convnet_small student on a
# Fashion-MNIST subset, the contrastive loss on the classifier outputs f(x) (L2-normalised, temperature
# 0.1, so similarities span [-10, 10]). Run from the repository root:
#   sh results/intra_class/convnet/run.sh            # SEEDS="0 1 2" LAMBDAS="0 0.1 0.3 1" RKD_LAMBDAS="0 1" by default
# then: python results/intra_class/convnet/summarise.py
# Runs go to $OUT (default /work/runs/intra_class_convnet); finished runs are skipped.
# TEACHER_OVERRIDES are key=value overrides given to the teachers only; the regime where distillation
# helps (teacher3000/README.md) trains the teachers on 3,000 images per class:
#   TEACHER_OVERRIDES=data.train_per_class=3000 OUT=/work/runs/intra_class_convnet3000 sh results/intra_class/convnet/run.sh
set -eu
OUT=${OUT:-/work/runs/intra_class_convnet}
PYTHON=${PYTHON:-python}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONPATH=src
SEEDS=${SEEDS:-0 1 2}
TEACHER_OVERRIDES=${TEACHER_OVERRIDES:-}
LAMBDAS=${LAMBDAS:-0 0.1 0.3 1}
RKD_LAMBDAS=${RKD_LAMBDAS:-0 1}
BASE=results/intra_class/convnet/base.yaml  # data subset, optimiser, schedule, epochs
TEACHER='{name: intra_class_teacher, embedding: logits, normalize: true, temperature: 0.1, margin_threshold: 0.5, cache_capacity: 64, cache_min_count: 16, intra_weight: LAM}'

run() {  # run COMMAND RUN_DIR OVERRIDES...
    command=$1 dir=$2
    shift 2
    grep -q "\"epoch\": 8," "$dir/metrics.jsonl" 2>/dev/null && return 0  # finished: its last (8th) epoch is logged
    $PYTHON -m kdcollapse "$command" --config $BASE run_dir="$dir" "$@" --overwrite
}

for seed in $SEEDS; do
    run train "$OUT/student_ce/seed$seed" seed=$seed model.name=convnet_small method="{name: vanilla}"
    for lam in $LAMBDAS; do
        run train "$OUT/teacher_l$lam/seed$seed" seed=$seed model.name=convnet \
            method="$(echo "$TEACHER" | sed "s/LAM/$lam/")" $TEACHER_OVERRIDES
        run distill "$OUT/student_kd_l$lam/seed$seed" seed=$seed model.name=convnet_small \
            method="{name: kd, ce_weight: 0.1, kd_weight: 0.9, temperature: 1.0}" \
            teacher.checkpoint="$OUT/teacher_l$lam/seed$seed"
    done
    for lam in $RKD_LAMBDAS; do
        run distill "$OUT/student_kdrkd_l$lam/seed$seed" seed=$seed model.name=convnet_small \
            method="{name: kd_rkd}" teacher.checkpoint="$OUT/teacher_l$lam/seed$seed"
    done
done
