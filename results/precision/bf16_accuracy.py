"""Does bf16 autocast keep KD and DHKD accuracy on Fashion-MNIST within seed noise of fp32?

Trains one fp32 teacher (configs/fashion_mnist/teacher.yaml), then students with KD and DHKD
(configs/fashion_mnist/kd.yaml, dhkd.yaml) for seeds 0, 1, 2 in fp32 (train.amp=off) and in bf16
(train.amp=bf16), and writes a table of mean ± sample std of the last test accuracy per method and
precision, with the bf16 - fp32 difference of means. Every run is an ordinary run directory under --out.

    PYTHONPATH=src python results/precision/bf16_accuracy.py --out runs/bf16_study            # full recipes
    PYTHONPATH=src python results/precision/bf16_accuracy.py --out /tmp/bf16 --quick          # minutes: a smoke test
    PYTHONPATH=src python results/precision/bf16_accuracy.py --out runs/bf16 --train-per-class 2000   # recipes, 1/3 data
--quick shrinks everything (100 training and 100 test images per class, 2 epochs): it shows the
pipeline works and nothing breaks in bf16, not that accuracy is preserved.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kdcollapse.config import load_config
from kdcollapse.report import mean_std, paired_t_test
from kdcollapse.train import fit

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["data.train_per_class=100", "data.test_per_class=100", "train.epochs=2", "schedule.warmup_epochs=0"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--train-per-class", type=int, help="a balanced training subset (the recipes' epochs)")
    args = parser.parse_args()
    subset = [f"data.train_per_class={args.train_per_class}"] if args.train_per_class else []
    common = ["train.progress=false", "train.device=cpu", *subset, *(QUICK if args.quick else [])]
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
        diffs = [b - a for a, b in zip(accs["off"], accs["bf16"])]
        p = paired_t_test(accs["bf16"], accs["off"])[1] if len(diffs) > 1 else float("nan")
        rows.append(f"| {method} | {mean_std(accs['off'])} | {mean_std(accs['bf16'])} | {mean_std(diffs)} | {p:.2f} | "
                    f"{', '.join(f'{a:.2f}' for a in accs['off'])} | {', '.join(f'{a:.2f}' for a in accs['bf16'])} |")
    table = "\n".join(["| method | fp32 last acc % | bf16 last acc % | bf16 − fp32 (paired by seed) | paired t-test p | "
                       "fp32 per seed | bf16 per seed |", "|---|---|---|---|---|---|---|", *rows])
    print(f"teacher {teacher.last_acc:.2f} %{' (quick)' if args.quick else ''}\n{table}")


if __name__ == "__main__":
    main()
