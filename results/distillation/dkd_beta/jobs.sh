#!/bin/bash
# Prints the job list of the DKD beta study (one run a line, for run_queue.py): bash jobs.sh RUNS "SEEDS"
# The DKD recipe of configs/<dataset>/dkd.yaml (alpha 1, T 4, cosine lr 0.1 with a 1-epoch warm-up, a 2-epoch
# ramp of the DKD term), shortened to 6 epochs at batch 64 on the subsets of results/distillation/collapse_k.
RUNS=$1 SEEDS=${2:-"0 1 2"}
source results/distillation/protocol.sh  # task K: cfgdir and sub
COMMON="data.batch_size=64 train.epochs=6"
for seed in $SEEDS; do
  for k in 10 100; do
    task $k
    for beta in 1 2 4 8; do
      echo "$RUNS/dkd_beta/k$k/beta$beta/seed$seed $cfgdir/dkd.yaml teacher.checkpoint=$RUNS/teacher_k$k seed=$seed $sub $COMMON method.beta=$beta"
    done
  done
done
for seed in $SEEDS; do  # the student trained alone under the same protocol, for reference
  for k in 10 100; do
    task $k
    echo "$RUNS/dkd_beta/k$k/student/seed$seed $cfgdir/student.yaml seed=$seed $sub $COMMON"
  done
done
