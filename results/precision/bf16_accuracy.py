"""Does bf16 autocast keep KD and DHKD accuracy on Fashion-MNIST within seed noise of fp32?

Trains one fp32 teacher (configs/fashion_mnist/teacher.yaml), then students with KD and DHKD
(configs/fashion_mnist/kd.yaml, dhkd.yaml) for seeds 0, 1, 2 in fp32 (train.amp=off) and in bf16
(train.amp=bf16), and writes a table of mean ± sample std of the last test accuracy per method and
precision, with the bf16 - fp32 difference of means. Every run is an ordinary run directory under --out.

    PYTHONPATH=src python results/precision/bf16_accuracy.py --out runs/bf16_study            # full recipes
    PYTHONPATH=src python results/precision/bf16_accuracy.py --out /tmp/bf16 --quick          # minutes: a smoke test
--quick shrinks everything (100 training and 100 test images per class, 2 epochs): it shows the
pipeline works and nothing breaks in bf16, not that accuracy is preserved.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from kdcollapse.config import load_config
from kdcollapse.train import fit

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["data.train_per_class=100", "data.test_per_class=100", "train.epochs=2", "schedule.warmup_epochs=0"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", default="0,1,2")
    args = parser.parse_args()
    common = ["train.progress=false", "train.device=cpu", *(QUICK if args.quick else [])]
    configs = ROOT / "configs" / "fashion_mnist"
    teacher = fit(load_config(configs / "teacher.yaml", [*common, f"run_dir={args.out / 'teacher'}"]),
                  overwrite=True)
    rows = []
    for method in ("kd", "dhkd"):
        accs = {}
        for amp in ("off", "bf16"):
            accs[amp] = [fit(load_config(configs / f"{method}.yaml", [
                *common, f"seed={seed}", f"train.amp={amp}", f"teacher.checkpoint={teacher.run_dir}",
                f"run_dir={args.out / method / amp / f'seed{seed}'}"]), overwrite=True).last_acc
                for seed in map(int, args.seeds.split(","))]
        mean = {k: statistics.mean(v) for k, v in accs.items()}
        std = {k: statistics.stdev(v) if len(v) > 1 else 0.0 for k, v in accs.items()}
        rows.append(f"| {method} | {mean['off']:.2f} ± {std['off']:.2f} | {mean['bf16']:.2f} ± {std['bf16']:.2f} | "
                    f"{mean['bf16'] - mean['off']:+.2f} | {', '.join(f'{a:.2f}' for a in accs['off'])} | "
                    f"{', '.join(f'{a:.2f}' for a in accs['bf16'])} |")
    table = "\n".join(["| method | fp32 last acc % | bf16 last acc % | bf16 − fp32 | fp32 per seed | bf16 per seed |",
                       "|---|---|---|---|---|---|", *rows])
    print(f"teacher {teacher.last_acc:.2f} %{' (quick)' if args.quick else ''}\n{table}")


if __name__ == "__main__":
    main()
