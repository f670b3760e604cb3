"""`kdcollapse geometry ...` end to end on tiny problems, and its file formats."""

import re

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from kdcollapse.cli import build_parser, main
from kdcollapse.errors import KdcollapseError
from kdcollapse.geometry import load_matrix, simplex_etf


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
