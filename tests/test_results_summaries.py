"""The decisions inside the results pages' summaries, on records written here: which τ the DHKD Tables 8–9 study
file chooses (on validation, never on test, over the seeds every τ has). The fronts' interpolation and the geometry
pages' paired differences are the library's now (tests/test_study_summary.py)."""

from __future__ import annotations

from pathlib import Path

from kdcollapse.study import load_study, summarise

RESULTS = Path(__file__).resolve().parents[1] / "results"
DHKD = load_study(RESULTS / "distillation/dhkd_ablation/study.yaml", runs_dir="no-runs-here")


def dhkd_records(val: dict, test: dict, seeds: dict | None = None) -> dict:
    """``runs.json`` records of the DHKD ablation's Tables 8–9 rows at K = 100: plain BinaryKL at each τ
    (validation ``val[τ] + seed``, test ``test[τ] + seed``) and BinaryKL-Norm τ = 2 (``dual_align``)."""
    rows = {t: f"dual_align_bkl_t{t}" for t in (0.25, 0.5, 1, 4, 8)} | {2: "dual_align_bkl"}
    records = {}
    for tau, row in rows.items():
        for seed in (seeds or {}).get(tau, (0, 1, 2)):
            records[f"dhkd_ablation/k100/{row}/seed{seed}"] = {
                "best": {"val_acc": val[tau] + seed, "test_acc": test[tau] + seed}, "last": {"test_acc": 0.0}}
    for seed, norm in enumerate((50.0, 52.0, 51.0)):
        records[f"dhkd_ablation/k100/dual_align/seed{seed}"] = {"best": {"val_acc": 58.0, "test_acc": norm},
                                                               "last": {"test_acc": norm}}
    return records


def test_best_tau_is_chosen_on_validation_and_compared_paired_by_seed():
    # τ = 4 has the best validation accuracy, τ = 1 the best test accuracy: the choice must be τ = 4
    val = {0.25: 50, 0.5: 51, 1: 52, 2: 53, 4: 60, 8: 54}
    test = {0.25: 50, 0.5: 51, 1: 70, 2: 53, 4: 55, 8: 54}
    text, summary = summarise(DHKD, dhkd_records(val, test))
    assert "Tables 8–9 at K = 100, plain BinaryKL on g′ over τ — chosen on validation (val_acc, seeds 0,1,2): " \
           "BinaryKL τ = 4" in text
    assert "| BinaryKL τ = 4 (chosen on val) | 0,1,2 |" in text
    rows = {(c["a"], c["b"]): c for c in summary["comparisons"] if c["seeds"]}
    # τ = 4 test accuracies 55, 56, 57 against BinaryKL-Norm 50, 52, 51, and against τ = 2's 53, 54, 55
    assert rows["BinaryKL τ = 4", "BinaryKL-Norm τ = 2"]["per_seed"] == [5.0, 4.0, 6.0]
    assert rows["BinaryKL τ = 4", "BinaryKL τ = 2"]["per_seed"] == [2.0, 2.0, 2.0]
    assert rows["BinaryKL τ = 4", "BinaryKL τ = 2"]["p"] == 0.0  # equal non-zero differences: t is infinite


def test_best_tau_compares_only_seeds_every_tau_has():
    val = dict.fromkeys((0.25, 0.5, 2, 4, 8), 70) | {1: 69.5}
    test = dict.fromkeys((0.25, 0.5, 1, 2, 4, 8), 70)
    records = dhkd_records(val, test, seeds={8: (0, 1)})
    records["dhkd_ablation/k100/dual_align_bkl_t1/seed2"]["best"]["val_acc"] = 170  # τ = 8 lacks seed 2
    text, _ = summarise(DHKD, records)
    assert "(val_acc, seeds 0,1): BinaryKL τ = 0.25" in text  # seed 2's 170 of τ = 1 is not counted
