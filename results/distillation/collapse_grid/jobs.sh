#!/bin/bash
# Prints the job list of the alpha x lr grid of CE + BinaryKL on one head (DHKD App. A, Tables 6-7; one run a
# line, for run_queue.py): bash jobs.sh RUNS "SEEDS". The protocol of ../collapse_k (convnet_small, batch 64,
# constant lr, no warm-up, tau = 2, 8 epochs, the same subsets and teachers), stable BinaryKL, with CE alone and
# BinaryKL alone at each lr as the "either loss alone" references.
RUNS=$1 SEEDS=${2:-"0"}
source results/distillation/protocol.sh  # task K: cfgdir and sub
COMMON="data.batch_size=64 schedule.name=constant schedule.warmup_epochs=0 train.epochs=8"
for seed in $SEEDS; do
  for k in 100 10; do
    task $k
    teacher="teacher.checkpoint=$RUNS/teacher_k$k"
    for lr in 0.1 0.05 0.01; do
      base="seed=$seed $sub $COMMON optim.lr=$lr"
      echo "$RUNS/collapse_grid/k$k/ce_lr$lr/seed$seed $cfgdir/student.yaml $base"
      echo "$RUNS/collapse_grid/k$k/bkl_only_lr$lr/seed$seed $cfgdir/binarykl_only.yaml $teacher $base"
      for a in 0.1 0.3 1 3 10 30; do
        echo "$RUNS/collapse_grid/k$k/ce_bkl_a${a}_lr$lr/seed$seed $cfgdir/ce_binarykl.yaml $teacher $base method.alpha=$a"
      done
    done
  done
done
