#!/bin/bash
# Runs one short distillation study: the teachers (teachers.sh), the study's jobs (STUDY/jobs.sh) with WORKERS
# processes of one thread each (workers.sh; re-running skips finished runs), then STUDY/summarise.py.
# Usage (repository root): RUNS=/path/to/runs bash results/distillation/run_study.sh STUDY [WORKERS]
# (SEEDS="0 1 2" and PY=python by default).
set -euo pipefail
STUDY=$1 WORKERS=${2:-2} RUNS=${RUNS:?set RUNS} SEEDS=${SEEDS:-"0 1 2"}
HERE=results/distillation/$STUDY
export OMP_NUM_THREADS=1 PYTHONPATH=${PYTHONPATH:-$PWD/src}
PY=${PY:-python}
RUNS=$RUNS PY=$PY bash results/distillation/teachers.sh
bash $HERE/jobs.sh "$RUNS" "$SEEDS" > $RUNS/${STUDY}_jobs.txt
PY=$PY bash results/distillation/workers.sh $RUNS/${STUDY}_jobs.txt $RUNS/${STUDY}_worker $WORKERS
$PY $HERE/summarise.py $RUNS $HERE
