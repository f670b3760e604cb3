#!/bin/bash
# Clean-vs-robust fronts of TRADES and IKL-AT on Fashion-MNIST (issue 13, experiment 5): trains and evaluates
# every setting of settings.sh for each seed (seed by seed, so that a stopped study has whole seeds), WORKERS
# at a time with one thread each, then summarises.
# Usage (repository root): RUNS=/path/to/runs SEEDS="0 1 2" bash results/adversarial/fronts/run.sh [WORKERS]
# (AA_IMAGES=2000 by default; PY=python.)
set -euo pipefail
WORKERS=${1:-2} RUNS=${RUNS:?set RUNS} SEEDS=${SEEDS:-"0 1 2"} PY=${PY:-python}
export OMP_NUM_THREADS=1 PYTHONPATH=${PYTHONPATH:-$PWD/src} PY AA_IMAGES=${AA_IMAGES:-2000}
source results/adversarial/fronts/settings.sh
for seed in $SEEDS; do
  for s in "${SETTINGS[@]}"; do read -r name _ <<< "$s"; echo "$name $seed"; done
done | xargs -P $WORKERS -L 1 bash results/adversarial/fronts/one.sh $RUNS || echo "some runs failed (above); the summary has the rest" >&2
$PY results/adversarial/fronts/summarise.py $RUNS results/adversarial/fronts
