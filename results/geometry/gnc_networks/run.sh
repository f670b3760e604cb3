#!/bin/sh
# GNC on real networks (results/geometry/gnc_networks/README.md). From the repository root:
#   sh results/geometry/gnc_networks/run.sh      # seeds 0,1,2; runs in $OUT (default /work/runs/gnc_networks)
set -eu
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONPATH=src
PYTHON=${PYTHON:-python}
$PYTHON results/geometry/gnc_networks/study.py --seeds "${SEEDS:-0,1,2}" --out "${OUT:-/work/runs/gnc_networks}"
$PYTHON results/geometry/gnc_networks/summarise.py
