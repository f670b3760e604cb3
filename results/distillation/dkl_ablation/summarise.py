"""Tables of the DKL Table 1 ablation (``run.sh``): each row's accuracy, and each step's paired difference.

    PYTHONPATH=src python results/distillation/dkl_ablation/summarise.py RUNS results/distillation/dkl_ablation

Reads ``RUNS/dkl_ablation/k<K>/<row>/seed<N>/`` (finished runs only); writes ``tables.md`` and
``summary.json``. Each run is read at its best-validation epoch (no setting is chosen: the rows are fixed by
the paper), and at its last epoch.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from study import ablation_tables, write_tables  # noqa: E402  (results/distillation/study.py)

ROWS = {"a_kd": "(a) KD", "b_dkl": "(b) DKL, α = β = 1", "c_dkl_ba": "(c) (b) + breaking asymmetry",
        "d_ikl": "(d) (c) + global information = IKL"}
STEPS = (("b_dkl", "a_kd"), ("c_dkl_ba", "b_dkl"), ("d_ikl", "c_dkl_ba"), ("d_ikl", "a_kd"))


def main(root: Path, out: Path) -> None:
    write_tables(out, *ablation_tables(root / "dkl_ablation", ROWS, STEPS))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
