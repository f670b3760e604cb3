#!/bin/bash
# Prints the job list of the DHKD ablation (paper Tables 5, 8-9, 12; one run a line, for run_queue.py):
#   bash jobs.sh RUNS "SEEDS"
# Each row is a recipe of configs/<dataset>/ with the named change, shortened to 6 epochs at batch 64 on the
# subsets and with the teachers of results/distillation/dkd_beta (the same protocol as dkl_ablation).
RUNS=$1 SEEDS=${2:-"0 1 2"}
source results/distillation/protocol.sh  # task K: cfgdir and sub
COMMON="data.batch_size=64 train.epochs=6"
declare -A ROW=(  # row: recipe and overrides
  [ce]="student"
  [kd]="kd"
  [bkl_only]="binarykl_only"
  [ce_bkl]="ce_binarykl"
  [dual]="dhkd method.alignment=off"
  [dual_align]="dhkd"
  [dual_align_mlp]="dhkd method.aux_head=mlp"
  [dual_align_bkl]="dhkd method.aux_loss=binary_kl"
  [dual_align_bkl_t0.25]="dhkd method.aux_loss=binary_kl method.temperature=0.25"
  [dual_align_bkl_t0.5]="dhkd method.aux_loss=binary_kl method.temperature=0.5"
  [dual_align_bkl_t1]="dhkd method.aux_loss=binary_kl method.temperature=1"
  [dual_align_bkl_t4]="dhkd method.aux_loss=binary_kl method.temperature=4"
  [dual_align_bkl_t8]="dhkd method.aux_loss=binary_kl method.temperature=8"
  [dual_kd]="dual_head_kd"
)
for seed in $SEEDS; do
  for k in 10 100; do
    task $k
    for row in ce kd bkl_only ce_bkl dual dual_align dual_align_mlp dual_align_bkl dual_kd \
        dual_align_bkl_t0.25 dual_align_bkl_t0.5 dual_align_bkl_t1 dual_align_bkl_t4 dual_align_bkl_t8; do
      read -r recipe overrides <<< "${ROW[$row]}"
      teacher=""; [ $recipe = student ] || teacher="teacher.checkpoint=$RUNS/teacher_k$k"
      echo "$RUNS/dhkd_ablation/k$k/$row/seed$seed $cfgdir/$recipe.yaml $teacher seed=$seed $sub $COMMON $overrides"
    done
  done
done
