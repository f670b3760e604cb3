#!/bin/bash
# Prints the job list of the long collapse runs (one run a line, for run_queue.py): bash jobs.sh RUNS "SEEDS"
# The protocol of ../collapse_k (convnet_small, batch 64, constant lr, no warm-up, tau = 2, the same subsets and
# teachers) at the paper's lr 0.01 and 16 times longer: 128 epochs = 4,096 SGD steps, evaluated every 8 epochs.
RUNS=$1 SEEDS=${2:-"0"}
source results/distillation/protocol.sh  # task K: cfgdir and sub
COMMON="data.batch_size=64 schedule.name=constant schedule.warmup_epochs=0 train.epochs=128 train.eval_every=8 optim.lr=0.01"
SETTINGS=(  # name recipe overrides
  "ce student"
  "bkl_only binarykl_only"
  "ce_bkl_stable ce_binarykl method.alpha=1"
  "ce_bkl_official ce_binarykl method.alpha=1 method.binary_kl_form=official"
)
for seed in $SEEDS; do
  for k in 10 100; do
    task $k
    for s in "${SETTINGS[@]}"; do
      read -r name recipe overrides <<< "$s"
      teacher=""; [ $recipe = student ] || teacher="teacher.checkpoint=$RUNS/teacher_k$k"
      echo "$RUNS/collapse_long/k$k/$name/seed$seed $cfgdir/$recipe.yaml $teacher seed=$seed $sub $COMMON $overrides"
    done
  done
done
