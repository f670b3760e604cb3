#!/bin/bash
# Prints the job list of the follow-up to ../collapse_grid (one run a line, for run_queue.py): bash jobs.sh RUNS
# "SEEDS". Same protocol (convnet_small, batch 64, constant lr, no warm-up, tau = 2, 8 epochs, the same subsets and
# teachers). Three questions: is a large BinaryKL step enough to break training without CE (BinaryKL alone at
# alpha 3, 10, 30)? does the official float32 clamp break it earlier (official form at alpha 1-30)? does gradient
# clipping at the paper's Table 7 values cure the broken cell or cost accuracy (and what does it cost CE alone)?
# Seed 0 of every setting comes first, then the other seeds.
RUNS=$1 SEEDS=${2:-"0"}
source results/distillation/protocol.sh  # task K: cfgdir and sub
COMMON="data.batch_size=64 schedule.name=constant schedule.warmup_epochs=0 train.epochs=8"
CLIPS="0.01 0.1 0.3 0.5 0.7 1.0"
for seed in $SEEDS; do
  for k in 100 10; do
    task $k
    teacher="teacher.checkpoint=$RUNS/teacher_k$k"
    out="$RUNS/collapse_clip/k$k"
    for lr in 0.1 0.05 0.01; do
      for a in 3 10 30; do
        echo "$out/bkl_only_a${a}_lr$lr/seed$seed $cfgdir/binarykl_only.yaml $teacher seed=$seed $sub $COMMON optim.lr=$lr method.alpha=$a"
      done
    done
    for lr in 0.1 0.01; do
      for a in 1 3 10 30; do
        echo "$out/ce_bkl_official_a${a}_lr$lr/seed$seed $cfgdir/ce_binarykl.yaml $teacher seed=$seed $sub $COMMON optim.lr=$lr method.alpha=$a method.binary_kl_form=official"
      done
    done
    for c in $CLIPS; do
      for a in 1 10; do
        echo "$out/ce_bkl_a${a}_lr0.1_clip$c/seed$seed $cfgdir/ce_binarykl.yaml $teacher seed=$seed $sub $COMMON optim.lr=0.1 method.alpha=$a optim.grad_clip=$c"
      done
      echo "$out/ce_lr0.1_clip$c/seed$seed $cfgdir/student.yaml seed=$seed $sub $COMMON optim.lr=0.1 optim.grad_clip=$c"
    done
  done
done
