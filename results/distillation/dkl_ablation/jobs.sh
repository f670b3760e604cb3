#!/bin/bash
# Prints the job list of the DKL Table 1 ablation (one run a line, for run_queue.py): bash jobs.sh RUNS "SEEDS"
# Rows: (a) KD, (b) DKL alpha = beta = 1, (c) (b) + breaking the asymmetry, (d) (c) + global information (IKL), all
# with the KD recipe's weights (0.1 CE + 0.9 tau^2 KL-type term, tau = 4) of configs/<dataset>/kd.yaml, shortened
# to 6 epochs at batch 64 on the subsets of results/distillation/dkd_beta (the same teachers).
RUNS=$1 SEEDS=${2:-"0 1 2"}
source results/distillation/protocol.sh  # task K: cfgdir and sub
COMMON="data.batch_size=64 train.epochs=6"
declare -A ROW=(
  [a_kd]="method.name=kd"
  [b_dkl]="method.name=dkl_kd"
  [c_dkl_ba]="method.name=dkl_kd method.breaking_asymmetry=true"
  [d_ikl]="method.name=dkl_kd method.breaking_asymmetry=true method.global_information=true"
)
for seed in $SEEDS; do
  for k in 10 100; do
    task $k
    for row in a_kd b_dkl c_dkl_ba d_ikl; do
      echo "$RUNS/dkl_ablation/k$k/$row/seed$seed $cfgdir/kd.yaml teacher.checkpoint=$RUNS/teacher_k$k seed=$seed $sub $COMMON ${ROW[$row]}"
    done
  done
done
