#!/bin/sh
# The Fashion-MNIST experiment of results/intra_class/fashion_mnist.md, run from the repository root:
#   sh results/intra_class/run_fashion_mnist.sh [teachers|students|baseline|all]
# Teachers: configs/intra_class/fashion_mnist/teacher.yaml with λ in $LAMBDAS (default 0 0.01 0.03 0.1;
# the results also have LAMBDAS=1, outside the paper's range) and seeds 0-2;
# students: configs/intra_class/fashion_mnist/student.yaml distilled from the teacher of the same λ and
# seed; baseline: the same student trained with CE alone. Runs go to $OUT (default
# /work/runs/intra_class/fashion_mnist); a run that already has a checkpoint is resumed (a finished one
# is left as it is). Then: python results/intra_class/analyse_fashion_mnist.py
set -eu
OUT=${OUT:-/work/runs/intra_class/fashion_mnist}
PYTHON=${PYTHON:-python}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONPATH=src
LAMBDAS=${LAMBDAS:-0 0.01 0.03 0.1}
CONFIGS=configs/intra_class/fashion_mnist
stage=${1:-all}

run() {  # run COMMAND RUN_DIR CONFIG OVERRIDES...
    command=$1 dir=$2 config=$3
    shift 3
    if [ -f "$dir/checkpoint.safetensors" ]; then
        $PYTHON -m kdcollapse "$command" --resume "$dir" train.progress=false
    else
        $PYTHON -m kdcollapse "$command" --config "$config" run_dir="$dir" train.progress=false "$@"
    fi
}

for seed in 0 1 2; do
    for lam in $LAMBDAS; do
        if [ "$stage" = teachers ] || [ "$stage" = all ]; then
            run train "$OUT/teacher_l$lam/seed$seed" $CONFIGS/teacher.yaml seed=$seed method.intra_weight=$lam
        fi
        if [ "$stage" = students ] || [ "$stage" = all ]; then
            run distill "$OUT/student_l$lam/seed$seed" $CONFIGS/student.yaml seed=$seed \
                teacher.checkpoint="$OUT/teacher_l$lam/seed$seed"
        fi
    done
    if [ "$stage" = baseline ] || [ "$stage" = all ]; then
        run train "$OUT/student_ce/seed$seed" $CONFIGS/student.yaml seed=$seed method="{name: vanilla}" \
            teacher.checkpoint=null
    fi
done
