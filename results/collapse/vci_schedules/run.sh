#!/bin/sh
# VCI paper Fig. 3 at CPU scale: the collapse metrics over training under a step schedule, a cosine
# schedule, and cosine without weight decay. From the repository root:
#   sh results/collapse/vci_schedules/run.sh      # SEEDS="0 1 2"; runs in $OUT (default /work/runs/vci_schedules)
# then: python results/collapse/vci_schedules/summarise.py
set -eu
OUT=${OUT:-/work/runs/vci_schedules}
PYTHON=${PYTHON:-python}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONPATH=src
BASE=results/collapse/vci_schedules/base.yaml
for seed in ${SEEDS:-0 1 2}; do
    for name in step cosine no_wd; do
        dir=$OUT/$name/seed$seed
        grep -q '"epoch": 20,' "$dir/metrics.jsonl" 2>/dev/null && continue
        case $name in
            step) extra="schedule.name=multistep schedule.milestones=[10,15]" ;;
            cosine) extra="" ;;
            no_wd) extra="optim.weight_decay=0" ;;
        esac
        $PYTHON -m kdcollapse train --config $BASE run_dir="$dir" seed=$seed $extra --overwrite
    done
done
