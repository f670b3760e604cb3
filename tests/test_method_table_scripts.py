"""The method-table page's helper scripts: stage2.py copies the report's validation choices into the study
file, overview.py derives the sorted table from summary.json."""
import importlib.util
import json
from pathlib import Path

from kdcollapse.study import load_study

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "results/distillation/method_table"


def _script(name):
    spec = importlib.util.spec_from_file_location(name, PAGE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_study_file_holds_its_stage_1_choices(tmp_path):
    stage2 = _script("stage2")
    study = tmp_path / "study.yaml"  # beside the committed records, with no run directories
    study.write_text((PAGE / "study.yaml").read_text().replace("runs_dir: runs/method_table_e25",
                                                                f"runs_dir: {tmp_path / 'no-runs'}"))
    (tmp_path / "runs.json").write_text((PAGE / "runs.json").read_text())
    chosen = stage2.choices(study)
    assert len(chosen) == 24
    text = study.read_text()
    assert stage2.rewrite(text, chosen) == text


def test_stage2_rewrites_the_final_group_and_the_labels():
    stage2 = _script("stage2")
    text = (PAGE / "study.yaml").read_text()
    chosen = {"kd": "τ = 8", "nst": "weight 100"}
    new = stage2.rewrite(text, chosen)
    assert "*kd_t8, *dkd_b1" in new and "*nst_w2" in new
    assert '{label: "KD (τ = 8)", short: "KD", group: grid, where: {key: kd, tag: "t8"}}' in new
    assert '{label: "KD (τ = 8)", short: "KD", group: final, where: {key: kd}}' in new
    assert '{label: "NST (weight 100)", short: "NST", group: grid, where: {key: nst, tag: "w2"}}' in new
    assert [line for line in new.splitlines() if "key: dkd," in line] == \
        [line for line in text.splitlines() if "key: dkd," in line]  # the other methods unchanged
    spec = load_study(PAGE / "study.yaml")
    assert spec.runs  # the file stays loadable


def test_overview_rows_are_the_summary_cells_sorted_with_their_comparisons():
    overview = _script("overview")
    summary = json.loads((PAGE / "summary.json").read_text())
    table = overview.table(summary, {}, None, "")
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    means = [float(r[2].split(" ± ")[0]) for r in rows]
    assert means == sorted(means, reverse=True) and len(rows) == 25
    by_method = {r[0].lstrip("| "): r for r in rows}
    fitnet = next(c for c in summary["comparisons"] if c["a"] == "FitNet" and c["b"] == "KD")
    assert by_method["FitNet"][3] == f"{fitnet['mean']:+.2f}" and by_method["FitNet"][5] == fitnet["verdict"]
    assert by_method["KD"][3] == "—"
