"""The summary's tables beyond one compared metric, on records written here (no training): comparisons of several
measures on one page (one Holm family, each measure's own noise floor and "better" direction), correlations
across a section's cells, and the plots a study file asks for, drawn from the records alone."""

from __future__ import annotations

import statistics

import pytest
from scipy import stats

from kdcollapse.errors import ConfigError
from kdcollapse.report import holm, pearson
from kdcollapse.study import figures, load_study, summarise, write_page

STUDY = """
name: measures
seeds: [0, 1, 2]
groups:
  - group: g
    run: x{x}/seed{seed}
    config: CONFIG
    grid: {x: [1, 2, 3, 4]}
summary:
  select: null
  metric: {metric: acc, label: acc}
  columns:
    - {metric: acc, label: acc (%)}
    - {metric: spread, digits: 3, label: spread, unit: "", noise_floor: 0.5, better: none}
    - {metric: loss, digits: 3, label: loss, unit: "", better: lower}
  noise_floor: 0.1
  sections:
    - title: grid
      cells: [{label: "x = {x}", short: "{x}", group: g}]
      compare: [["4", "1"], ["4", "1", spread], ["4", "1", loss], ["2", "1", spread]]
      correlate: {x: [spread, loss], y: acc}
PLOTS
"""
# acc rises with x, spread rises with x (by 0.3 at x = 2, below its noise floor), loss falls with x
def _noise(x: int, s: int) -> float:
    return ((7 * x + 3 * s + x * s) % 5) / 10


RECORDS = {f"x{x}/seed{s}": {"last": {"acc": 50 + 5 * x + s + _noise(x, s),
                                      "spread": 0.3 * (x - 1) ** 2 + 0.1 * _noise(x, s),
                                      "loss": 2.0 / x + 0.02 * s * x}}
           for x in (1, 2, 3, 4) for s in (0, 1, 2)}


def make(tmp_path, plots: str = ""):
    (tmp_path / "c.yaml").write_text("method: {name: vanilla}\n")
    path = tmp_path / "page" / "study.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(STUDY.replace("CONFIG", str(tmp_path / "c.yaml")).replace("PLOTS", plots))
    return load_study(path, runs_dir=tmp_path / "runs")


def value(name: str, x: int, s: int) -> float:
    return RECORDS[f"x{x}/seed{s}"]["last"][name]


def test_several_measures_are_one_holm_family_with_their_own_floor_and_direction(tmp_path):
    text, summary = summarise(make(tmp_path), RECORDS)
    acc, spread, loss, small = summary["comparisons"]
    assert [c.get("measure") for c in (acc, spread, loss, small)] == [None, "spread", "loss", "spread"]
    for c, name, (a, b) in ((acc, "acc", (4, 1)), (spread, "spread", (4, 1)), (loss, "loss", (4, 1)),
                            (small, "spread", (2, 1))):
        x, y = [value(name, a, s) for s in range(3)], [value(name, b, s) for s in range(3)]
        assert c["p"] == pytest.approx(stats.ttest_rel(x, y).pvalue)
    assert [c["holm_p"] for c in summary["comparisons"]] == holm([c["p"] for c in summary["comparisons"]])
    assert acc["verdict"] == "better"
    assert spread["verdict"] == "higher"  # better: none -> the sign, by the same rule
    assert loss["verdict"] == "better"  # lower loss at x = 4
    assert abs(small["mean"]) < 0.5 and small["verdict"] == "no difference shown"  # under spread's noise floor
    assert "| 4 − 1 | spread | 0,1,2 |" in text and "| 4 − 1 | acc (pp) | 0,1,2 |" in text


def test_correlations_across_cells_match_scipy(tmp_path):
    text, summary = summarise(make(tmp_path), RECORDS)
    (spread, loss) = summary["sections"][0]["correlations"]
    means = {name: [statistics.mean(value(name, x, s) for s in range(3)) for x in (1, 2, 3, 4)]
             for name in ("acc", "spread", "loss")}
    assert spread["r_of_means"] == pytest.approx(stats.pearsonr(means["spread"], means["acc"])[0])
    for s in range(3):
        xs = [value("loss", x, s) for x in (1, 2, 3, 4)]
        ys = [value("acc", x, s) for x in (1, 2, 3, 4)]
        assert loss["per_seed"][s] == pytest.approx(stats.pearsonr(xs, ys)[0])
    assert "| loss | -0." in text and "0 of 3 |" in text
    assert pearson([1, 1, 1], [1, 2, 3]) != pearson([1, 1, 1], [1, 2, 3])  # nan: a constant side


PLOTS = """  plots:
    - {file: curve.png, section: grid, x: x, panels: [[acc], [spread, loss]], lines: [loss]}
    - {file: points.png, kind: scatter, sections: [grid], x: [spread, loss], y: acc}
    - {file: bars.png, kind: bars, section: grid, bars: [acc, spread]}
"""


def test_plots_come_from_the_records_and_are_checked_like_the_tables(tmp_path):
    pytest.importorskip("matplotlib")
    study = make(tmp_path, PLOTS)
    images = figures(study, RECORDS)
    assert set(images) == {"curve.png", "points.png", "bars.png"}
    assert all(image.startswith(b"\x89PNG") for image in images.values())
    assert figures(study, RECORDS) == images  # the same records draw the same bytes
    (study.path.parent / "runs.json").write_text(__import__("json").dumps(RECORDS))
    assert sorted(p.name for p in write_page(study)) == ["README.md", "bars.png", "curve.png", "points.png",
                                                         "runs.json", "summary.json"]
    assert write_page(study, check=True) == []
    assert "![curve](curve.png)" in (study.path.parent / "README.md").read_text()
    (study.path.parent / "curve.png").write_bytes(b"stale")
    assert [p.name for p in write_page(study, check=True)] == ["curve.png"]


@pytest.mark.parametrize("plots, message", [
    ("  plots: [{file: a.png, section: nope, x: x, panels: [[acc]]}]", "section of plot 'a.png'"),
    ("  plots: [{file: a.svg, section: grid, x: x, panels: [[acc]]}]", "a summary plot is"),
    ("  plots: [{file: a.png, section: grid, x: y, panels: [[acc]]}]", "must be a grid field"),
    ("  plots: [{file: a.png, section: grid, x: x, panels: [[accuracy]]}]", "'accuracy'"),
    ("  plots: [{file: a.png, kind: curves, section: grid}]", "'metrics' lists column metrics"),
    ("  plots: [{file: a.png, kind: curves, section: grid, metrics: [acc], cells: 'y*'}]", "'cells' matches"),
    ("  plots: [{file: a.png, kind: curve, section: grid, metrics: [acc]}]", "curves: file, kind, title"),
])
def test_bad_plots_are_refused_with_the_key_named(tmp_path, plots, message):
    with pytest.raises(ConfigError, match=message):
        figures(make(tmp_path, plots + "\n"), RECORDS)


@pytest.mark.parametrize("change, message", [
    (('["2", "1", spread]', '["2", "1", nope]'), "'nope'"),
    (('["2", "1", spread]', '["2"]'), "a comparison is"),
    (("better: lower", "better: up"), "'better'"),
    (("correlate: {x: [spread, loss], y: acc}", "correlate: {x: spread}"), "'correlate' is"),
])
def test_bad_comparisons_and_correlations_are_refused(tmp_path, change, message):
    study = make(tmp_path)
    study.path.write_text(study.path.read_text().replace(*change))
    with pytest.raises(ConfigError, match=message):
        summarise(load_study(study.path, runs_dir=tmp_path / "runs"), RECORDS)


def test_nested_post_step_files_are_read_as_joined_keys_and_columns_scale_them():
    from kdcollapse.study._records import _flat_json
    from kdcollapse.study._summary_spec import Measure

    report = {"max_logit": 3.0,
              "pgd-20 Linf eps=0.1 last": {"robust_accuracy": 0.5, "stages": [{"robust_accuracy": 0.25}]}}
    assert _flat_json(report) == {"max_logit": 3.0, "pgd-20 Linf eps=0.1 last/robust_accuracy": 0.5,
                                  "pgd-20 Linf eps=0.1 last/stages/0/robust_accuracy": 0.25}
    m = Measure.parse({"metric": "pgd-20 Linf eps=0.1 last/stages/0/robust_accuracy", "scale": 100}, None)
    assert m.of({"last": _flat_json(report)}) == 25.0
    with pytest.raises(ConfigError, match="'scale' is a number > 0"):
        Measure.parse({"metric": "x", "scale": 0}, None)


def test_a_post_step_file_in_a_folder_prefixes_its_keys_and_a_cell_without_a_metric_shows_a_dash(tmp_path):
    from kdcollapse.study._records import _flat_json, _folder

    assert _folder("analysis_test/analysis.json") == "analysis_test" and _folder("max_logit.json") == ""
    assert _flat_json({"metrics": {"nc1": 1.5}}, _folder("analysis_train/analysis.json")) == {
        "analysis_train/metrics/nc1": 1.5}
    study = make(tmp_path)
    records = {k: {"last": {m: v for m, v in r["last"].items() if not (m == "loss" and k.startswith("x1/"))}}
               for k, r in RECORDS.items()}
    study.summary["sections"][0]["compare"] = [["4", "2"]]
    study.summary["sections"][0].pop("correlate")
    text, _ = summarise(study, records)
    assert "| x = 1 | 0,1,2 |" in text and text.split("| x = 1 | 0,1,2 |")[1].split("\n")[0].endswith("| – |")


FRONT = """
name: fronts
seeds: [0, 1, 2]
groups:
  - group: t
    run: t{b}/seed{seed}
    config: CONFIG
    grid: {b: [1, 9]}
  - group: i
    run: i/seed{seed}
    config: CONFIG
summary:
  select: null
  metric: {metric: aa}
  columns: [{metric: clean}, {metric: aa}]
  sections:
    - title: fronts
      cells: [{label: "T {b}", group: t}, {label: I, group: i}]
      front: {cells: I, along: "T *", label: the front, x: clean, y: [aa]}
"""


def front_study(tmp_path, runs: dict):
    (tmp_path / "c.yaml").write_text("method: {name: vanilla}\n")
    path = tmp_path / "study.yaml"
    path.write_text(FRONT.replace("CONFIG", str(tmp_path / "c.yaml")))
    study = load_study(path, runs_dir=tmp_path / "runs")
    records = {f"{name}/seed{seed}": {"last": {"clean": c, "aa": a}} for name, seeds in runs.items()
               for seed, (c, a) in seeds.items()}
    return summarise(study, records)[1]["comparisons"]


def test_a_front_pairs_each_seed_with_its_own_interpolated_front_and_never_extrapolates(tmp_path):
    runs = {"t1": {0: (80.0, 46.0), 1: (81.0, 47.0), 2: (80.0, 46.0)},
            "t9": {0: (76.0, 50.0), 1: (77.0, 50.0), 2: (76.0, 50.0)},
            "i": {0: (78.0, 53.0), 1: (79.0, 52.0), 2: (75.0, 60.0)}}  # seed 2 lies below its front: left out
    (c,) = front_study(tmp_path, runs)
    assert c["a"] == "I" and c["b"] == "the front at its clean at last epoch" and c["seeds"] == [0, 1]
    assert c["per_seed"] == pytest.approx([5.0, 3.5])  # seed 0: front at 78 is 48.0; seed 1: at 79 it is 48.5
    assert c["p"] == pytest.approx(stats.ttest_rel([53.0, 52.0], [48.0, 48.5]).pvalue)
    runs["i"][1] = (90.0, 52.0)  # now one seed only: no test
    assert front_study(tmp_path, runs) == []


def test_a_single_seed_cell_shows_its_value_not_a_zero_std(tmp_path):
    study = make(tmp_path)
    records = {k: r for k, r in RECORDS.items() if not k.startswith("x1/") or k == "x1/seed0"}
    text, _ = summarise(study, records)
    row = next(line for line in text.splitlines() if line.startswith("| x = 1 |"))
    assert row.startswith(f"| x = 1 | 0 | {value('acc', 1, 0):.2f} | {value('spread', 1, 0):.3f} |")
    assert "±" not in row
    assert "±" in next(line for line in text.splitlines() if line.startswith("| x = 2 |"))


def test_curves_are_each_cells_mean_and_std_over_seeds_per_epoch_from_the_records(tmp_path):
    from kdcollapse.study._figures import _curve_panels
    from kdcollapse.study._summary_spec import check_summary

    study = make(tmp_path, "  plots: [{file: c.png, kind: curves, section: grid, metrics: [acc], cells: 'x = [12]'}]")
    epochs = {k: {**r, "epochs": {"acc": [[e, r["last"]["acc"] - 3 + e] for e in (1, 2, 3)
                                          if not (e == 2 and k == "x1/seed2")]}} for k, r in RECORDS.items()}
    spec = check_summary(study.summary)
    (panel,) = _curve_panels(study, epochs, spec, spec["sections"][0], spec["plots"][0])
    one, two = panel["series"]
    assert [one["label"], two["label"]] == ["x = 1 (3 seeds)", "x = 2 (3 seeds)"]
    assert one["x"] == [1, 3] and two["x"] == [1, 2, 3]  # the epochs every seed of the cell evaluated
    at = [[value("acc", 2, s) - 3 + e for s in range(3)] for e in (1, 2, 3)]
    assert two["y"] == [statistics.mean(v) for v in at] and two["yerr"] == [statistics.stdev(v) for v in at]
    pytest.importorskip("matplotlib")
    image = figures(study, epochs)["c.png"]
    assert image.startswith(b"\x89PNG") and figures(study, epochs)["c.png"] == image
    with pytest.raises(ConfigError, match="keep no per-epoch acc"):
        figures(study, RECORDS)  # records written without the opt-in


def test_a_rank_correlation_across_every_run_controlling_for_a_column_matches_scipy(tmp_path):
    """``correlate: {..., across: runs, control: METRIC}``: Spearman's ρ over every run of the cells (12 points
    here) and the partial ρ controlling for ``control`` (the residual definition, with scipy)."""
    import numpy as np

    from kdcollapse.report import partial_spearman

    study = make(tmp_path)
    study.summary["sections"][0]["correlate"] = {"x": ["spread", "acc"], "y": "loss", "across": "runs",
                                                 "control": "acc"}
    text, summary = summarise(study, RECORDS)
    spread, acc = summary["sections"][0]["correlations"]
    xs, ys, zs = ([value(n, x, s) for x in (1, 2, 3, 4) for s in range(3)] for n in ("spread", "loss", "acc"))
    assert spread["runs"] == 12 and spread["spearman_rho"] == pytest.approx(stats.spearmanr(xs, ys)[0])
    rx, ry, rz = (stats.rankdata(v) for v in (xs, ys, zs))
    design = np.column_stack([np.ones(12), rz])
    residual = [r - design @ np.linalg.lstsq(design, r, rcond=None)[0] for r in (rx, ry)]
    assert spread["partial_rho"] == pytest.approx(stats.pearsonr(*residual)[0])
    assert (spread["partial_rho"], spread["partial_p"]) == pytest.approx(partial_spearman(xs, ys, zs))
    assert np.isnan(acc["partial_rho"])  # controlling for itself: nothing is left
    assert "partial ρ controlling for acc (%)" in text and "| Spearman ρ with loss across the runs |" in text
    study.summary["sections"][0]["correlate"] = {"x": ["spread"], "y": "loss", "control": "acc"}
    with pytest.raises(ConfigError, match="across: runs"):
        summarise(study, RECORDS)
