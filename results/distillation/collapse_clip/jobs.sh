#!/bin/bash
# Prints the job list of the follow-up to ../collapse_grid (one run a line, for run_queue.py): bash jobs.sh RUNS
# "SEEDS". Same protocol (convnet_small, batch 64, constant lr, no warm-up, tau = 2, 8 epochs, the same subsets and
# teachers). Two questions about the cells where CE + BinaryKL broke: is the large BinaryKL step enough to break
# training without CE (BinaryKL alone at alpha 10 and 30, at the lrs where the combination broke)? does gradient
# clipping (a max-norm from the paper's Table 7) rescue alpha 10 at lr 0.1, and what does it cost at alpha 1 and
# for CE alone? Then, after every seed of those: does the official float32 clamp break CE + BinaryKL earlier than
# the stable form (alpha 1, 10, 30 at lr 0.1)?
# The grid is cut to what decides these questions: on the shared 2-core machine a run took 75-200 s.
RUNS=$1 SEEDS=${2:-"0"}
source results/distillation/protocol.sh  # task K: cfgdir and sub
COMMON="data.batch_size=64 schedule.name=constant schedule.warmup_epochs=0 train.epochs=8"
CLIPS="0.1 1.0"
for seed in $SEEDS; do
  for k in 100 10; do
    task $k
    teacher="teacher.checkpoint=$RUNS/teacher_k$k"
    out="$RUNS/collapse_clip/k$k"
    for cell in "10 0.1" "30 0.05" "10 0.05" "30 0.1"; do
      read -r a lr <<< "$cell"
      echo "$out/bkl_only_a${a}_lr$lr/seed$seed $cfgdir/binarykl_only.yaml $teacher seed=$seed $sub $COMMON optim.lr=$lr method.alpha=$a"
    done
    for c in $CLIPS; do
      for a in 10 1; do
        echo "$out/ce_bkl_a${a}_lr0.1_clip$c/seed$seed $cfgdir/ce_binarykl.yaml $teacher seed=$seed $sub $COMMON optim.lr=0.1 method.alpha=$a optim.grad_clip=$c"
      done
      echo "$out/ce_lr0.1_clip$c/seed$seed $cfgdir/student.yaml seed=$seed $sub $COMMON optim.lr=0.1 optim.grad_clip=$c"
    done
  done
done
for seed in $SEEDS; do
  for k in 100 10; do
    task $k
    for a in 1 10 30; do
      echo "$RUNS/collapse_clip/k$k/ce_bkl_official_a${a}_lr0.1/seed$seed $cfgdir/ce_binarykl.yaml teacher.checkpoint=$RUNS/teacher_k$k seed=$seed $sub $COMMON optim.lr=0.1 method.alpha=$a method.binary_kl_form=official"
    done
  done
done
