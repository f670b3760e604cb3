"""`kdcollapse geometry ...` end to end on tiny problems, and its file formats."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from kdcollapse.cli import build_parser, main
from kdcollapse.errors import KdcollapseError
from kdcollapse.geometry import load_matrix, simplex_etf

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    status = main(["geometry", *map(str, argv)])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("command", ["softmax-code", "tammes", "bounds", "distance", "ufm"])
def test_every_command_has_help_with_examples(capsys, command):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["geometry", command, "--help"])
    assert f"kdcollapse geometry {command}" in capsys.readouterr().out.split("examples:")[1]


def test_softmax_code_prints_saves_and_draws(capsys, tmp_path):
    out = tmp_path / "etf.safetensors"
    status, text, _ = run(capsys, "softmax-code", "-K", 4, "-d", 3, "--restarts", 1, "--steps", 50, "--out", out)
    assert status == 0
    assert re.search(r"rho one-vs-rest \(GNC2, distance\) +1\.33333", text) and "known optimum (Thm 3.3)" in text
    with safe_open(out, "pt") as f:
        assert f.get_tensor("W").shape == (4, 3) and f.metadata()["kind"] == "softmax"
    assert out.with_suffix(".png").stat().st_size > 1000


def test_tammes_saves_npy(capsys, tmp_path):
    status, text, _ = run(capsys, "tammes", "-K", 6, "-d", 3, "--restarts", 1, "--steps", 50, "--out", tmp_path / "o.npy",
                          "--plot", tmp_path / "o.png")
    assert status == 0 and re.search(r"min angle \(degrees\) +90\.0000000", text)
    assert np.load(tmp_path / "o.npy").shape == (6, 3) and (tmp_path / "o.png").exists()


def test_bounds_table(capsys):
    status, text, _ = run(capsys, "bounds", "-K", 4, 100, "-d", 3)
    assert status == 0
    assert "no (K too small)" in text and "1.33333" in text  # K=4, d=3: invalid range, ETF closed form
    assert "0.00666667" in text  # K=100, d=3 lower bound


def test_distance_of_npy_safetensors_and_pt(capsys, tmp_path):
    W = simplex_etf(5, 4) * 3
    np.save(tmp_path / "w.npy", W.numpy())
    save_file({"head.weight": W, "head.bias": torch.zeros(5)}, tmp_path / "m.safetensors")
    torch.save({"model": {"fc.weight": W, "conv.weight": torch.ones(2, 2)}}, tmp_path / "c.pt")
    for argv in (["w.npy"], ["m.safetensors"], ["c.pt", "--key", "model.fc.weight"]):
        status, text, _ = run(capsys, "distance", tmp_path / argv[0], *argv[1:], "--csv", tmp_path / "d.csv")
        assert status == 0 and re.search(r"rho one-vs-rest = min distance \(GNC2\) +1\.2500000000", text)
    rows = (tmp_path / "d.csv").read_text().splitlines()
    assert rows[0] == "class,distance,gap" and len(rows) == 6 and float(rows[1].split(",")[1]) == pytest.approx(1.25)


def test_distance_errors_are_clear(capsys, tmp_path):
    torch.save({"a": torch.ones(3, 2), "b": torch.ones(4, 2)}, tmp_path / "two.pt")
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    (tmp_path / "w.txt").write_text("1 2")
    for name, message in [
        ("missing.npy", "no such file"),
        ("two.pt", "2 2-D tensors; choose one with --key: a, b"),
        ("bad.npy", "cannot read"),
        ("w.txt", "unknown matrix file type '.txt'"),
    ]:
        status, _, err = run(capsys, "distance", tmp_path / name)
        assert status == 2 and message in err, err
    with pytest.raises(KdcollapseError, match="unknown tensor in two.pt 'c'"):
        load_matrix(tmp_path / "two.pt", key="c")


def test_pickled_objects_are_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"w": torch.ones(3, 2), "x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(KdcollapseError, match="cannot read"):
        load_matrix(tmp_path / "evil.pt")


def test_bad_sizes_report_an_error(capsys):
    status, _, err = run(capsys, "softmax-code", "-K", 1, "-d", 3)
    assert status == 2 and "K must be an integer >= 2" in err


def test_ufm_report_is_drawn_from_its_records_and_checked(capsys, tmp_path, monkeypatch):
    from kdcollapse.experiments import ufm_report
    from kdcollapse.experiments.ufm_report import _fmt

    # --quick: the whole pipeline on small sizes. The page and the figures come from ufm.json alone: --check redraws
    # them and finds nothing to change; a hand edit of the page or a changed figure is out of date; nothing written.
    # Experiment A with a tenth of --quick's iterations (its sizes as shipped): 60 GNC logs of its 4 runs, not 200.
    compare = {**ufm_report._QUICK["compare"], "gd_steps": 20, "lbfgs_steps": 10}
    monkeypatch.setitem(ufm_report._QUICK, "compare", compare)
    out = tmp_path / "ufm"
    status, text, _ = run(capsys, "ufm", "--quick", "--out", out)
    assert status == 0 and "wrote" in text
    records = json.loads((out / "ufm.json").read_text())
    assert records["quick"] and {k: records["compare"][k] for k in compare} == compare
    page = (out / "ufm.md").read_text()
    sphere = records["compare"]["runs"][2]
    assert (sphere["regularization"], sphere["optimizer"]) == ("sphere", "lbfgs")
    assert f"| sphere | lbfgs | {_fmt(sphere['final']['loss'])} | {_fmt(sphere['final']['gnc1'])} |" in page
    assert records["machine"] in page and (out / "ufm_sphere_vs_wd.png").stat().st_size > 10_000
    assert run(capsys, "ufm", "--check", "--out", out)[0] == 0
    (out / "ufm.md").write_text(page.replace("## B.", "## B!"))
    (out / "ufm_temperature_sweep.png").write_bytes(b"not the figure")
    status, text, _ = run(capsys, "ufm", "--check", "--out", out)
    assert status == 1 and f"out of date: {out / 'ufm.md'}" in text and "ufm_temperature_sweep.png" in text
    assert (out / "ufm_temperature_sweep.png").read_bytes() == b"not the figure"  # --check writes nothing
    (out / "ufm.md").write_text("# a page without markers\n")
    status, _, err = run(capsys, "ufm", "--quick", "--out", out)
    assert status == 2 and "has no ufm report markers" in err and (out / "ufm.md").read_text().startswith("# a page")
    status, _, err = run(capsys, "ufm", "--check", "--out", tmp_path / "empty")
    assert status == 2 and "ufm.json not found" in err


def test_the_committed_ufm_page_is_what_its_records_give():
    from kdcollapse.experiments.ufm_report import write_ufm_report

    assert write_ufm_report(ROOT / "results/geometry", check=True) == [], \
        "run `kdcollapse geometry ufm --out results/geometry`"
