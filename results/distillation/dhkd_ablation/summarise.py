"""Tables of the DHKD ablation (``run.sh``): each row's accuracy, and each component's paired difference.

    PYTHONPATH=src python results/distillation/dhkd_ablation/summarise.py RUNS results/distillation/dhkd_ablation

Reads ``RUNS/dhkd_ablation/k<K>/<row>/seed<N>/`` (finished runs only); writes ``tables.md`` and
``summary.json``; each run read at its best-validation epoch and at its last epoch.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from study import ablation_tables, write_tables  # noqa: E402  (results/distillation/study.py)

ROWS = {"ce": "CE only (the student alone)", "kd": "KD (one head)", "bkl_only": "BinaryKL only (one head)",
        "ce_bkl": "CE+BinaryKL (one head)", "dual": "dual (CE on g, BinaryKL-Norm on g′, no alignment)",
        "dual_align": "dual+align (DHKD, the recipe)", "dual_align_mlp": "dual+align+mlp (nonlinear g′)",
        "dual_align_bkl": "dual+align+BinaryKL (plain BinaryKL on g′, τ = 2)",
        "dual_kd": "dual+KD (KL on g′, Table 12)"}
STEPS = (("dual", "ce_bkl"), ("dual_align", "dual"), ("dual_align_mlp", "dual_align"),
         ("dual_align_bkl", "dual_align"), ("dual", "dual_kd"), ("dual_align", "kd"), ("ce_bkl", "ce"),
         ("dual_align", "ce"))


def main(root: Path, out: Path) -> None:
    write_tables(out, *ablation_tables(root / "dhkd_ablation", ROWS, STEPS))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
