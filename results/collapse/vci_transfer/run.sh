#!/bin/sh
# VCI predicts transferability? (results/collapse/vci_transfer/README.md). From the repository root:
#   sh results/collapse/vci_transfer/run.sh        # seeds 0,1,2; runs in $OUT (default /work/runs/vci_transfer)
set -eu
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONPATH=src
PYTHON=${PYTHON:-python}
$PYTHON results/collapse/vci_transfer/study.py --seeds "${SEEDS:-0,1,2}" --out "${OUT:-/work/runs/vci_transfer}"
$PYTHON results/collapse/vci_transfer/summarise.py
