"""The decisions inside the results pages' summaries, on records or run directories written here: where a front
is interpolated (and where it refuses to extrapolate), which seeds a matched comparison pairs, which τ the DHKD
Tables 8–9 study file chooses (on validation, never on test, over the seeds every τ has), and the paired
differences of the geometry pages."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from scipy import stats

from kdcollapse.study import load_study, summarise

RESULTS = Path(__file__).resolve().parents[1] / "results"
DHKD = load_study(RESULTS / "distillation/dhkd_ablation/study.yaml", runs_dir="no-runs-here")


def script(path: str, name: str):
    """Import ``results/<path>`` as module ``name`` (the scripts are run as files, not a package); the folders
    it puts on ``sys.path`` and the helper modules it imports from them (``study``) are taken back after."""
    path_before, modules_before = list(sys.path), set(sys.modules)
    spec = importlib.util.spec_from_file_location(name, RESULTS / path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path_before
        for added in set(sys.modules) - modules_before:
            if getattr(sys.modules[added], "__file__", "") and str(RESULTS) in sys.modules[added].__file__:
                del sys.modules[added]
    return module


@pytest.fixture(scope="module")
def fronts():
    pytest.importorskip("matplotlib")
    return script("adversarial/fronts/summarise.py", "fronts_summarise")


def test_front_interpolates_between_neighbours_and_never_extrapolates(fronts):
    points = [(82.0, 47.0), (76.0, 50.0), (79.0, 49.0)]  # unsorted on purpose
    assert fronts.front_at(points, 77.5) == pytest.approx(49.5)  # halfway between (76, 50) and (79, 49)
    assert fronts.front_at(points, 76.0) == pytest.approx(50.0)
    assert fronts.front_at(points, 75.9) is None
    assert fronts.front_at(points, 82.1) is None


def test_matched_pairs_each_seed_with_its_own_front_and_drops_seeds_off_it(fronts):
    runs = {
        "trades_b1": {0: {"clean": 80.0, "aa": 46.0}, 1: {"clean": 81.0, "aa": 47.0}, 2: {"clean": 80.0, "aa": 46.0}},
        "trades_b9": {0: {"clean": 76.0, "aa": 50.0}, 1: {"clean": 77.0, "aa": 50.0}, 2: {"clean": 76.0, "aa": 50.0}},
        # seed 2 lies below its front's clean range: left out, not extrapolated
        "ikl_at_x": {0: {"clean": 78.0, "aa": 53.0}, 1: {"clean": 79.0, "aa": 52.0}, 2: {"clean": 75.0, "aa": 60.0}},
    }
    row = fronts.matched(runs, ["trades_b1", "trades_b9"], "ikl_at_x", "aa")
    assert row[2] == "0,1"
    # seed 0: front at 78 is 48.0 -> +5.0; seed 1: front at 79 is 48.5 -> +3.5
    assert row[3] == "+5.00, +3.50"
    expected_p = stats.ttest_rel([53.0, 52.0], [48.0, 48.5]).pvalue
    assert row[4] == "+4.25" and float(row[5]) == pytest.approx(expected_p, abs=5e-4)
    runs["ikl_at_x"][1]["clean"] = 90.0  # now one seed only: no test
    assert fronts.matched(runs, ["trades_b1", "trades_b9"], "ikl_at_x", "aa") is None


def test_both_higher_needs_both_accuracies_in_the_mean(fronts):
    runs = {"a": {0: {"clean": 75.0, "aa": 53.0}, 1: {"clean": 76.0, "aa": 54.0}},
            "b": {0: {"clean": 74.0, "aa": 50.0}, 1: {"clean": 75.0, "aa": 49.0}},
            "c": {0: {"clean": 80.0, "aa": 47.0}, 1: {"clean": 80.0, "aa": 47.0}}}
    assert fronts.both_higher(runs, "a", "b")
    assert not fronts.both_higher(runs, "a", "c")  # more robust but less clean
    assert not fronts.both_higher(runs, "b", "a")


def test_load_reads_robust_eval_and_the_stages_autoattack_broke(fronts, tmp_path):
    stages = [{"attack": a, "broken": b} for a, b in (("apgd-ce", 400), ("apgd-t", 40), ("fab-t", 1), ("square", 2))]
    (tmp_path / "robust_eval.json").write_text(json.dumps({
        fronts.PGD: {"clean_accuracy": 0.75, "robust_accuracy": 0.55},
        fronts.AA: {"clean_accuracy": 0.76, "robust_accuracy": 0.53, "examples": "first 2000 test images",
                    "stages": stages}}))
    got = fronts.load(tmp_path)
    assert got["clean"] == pytest.approx(75.0) and got["pgd20"] == pytest.approx(55.0)
    assert got["aa"] == pytest.approx(53.0) and got["aa_images"] == 2000
    assert got["aa_broken"] == {"apgd-ce": 400, "apgd-t": 40, "fab-t": 1, "square": 2}
    assert fronts.load(tmp_path / "missing") is None


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
