"""``kdcollapse.report``'s tables of per-seed values: cells, tables, paired comparisons with Holm's correction."""

from __future__ import annotations

import math

import pytest

from kdcollapse.errors import KdcollapseError
from kdcollapse.report import (comparisons_table, holm, markdown_table, paired_comparisons, paired_t_test, seeds_cell,
                               seeds_table)


def test_seeds_cell_writes_mean_std_a_single_value_or_nan():
    assert seeds_cell([1.0, 2.0, 4.0], 2) == "2.33 ± 1.53"
    assert seeds_cell([46.0412], 1, single_digits=2) == "46.04"
    assert seeds_cell([0.5], 3) == "0.500"
    assert seeds_cell([1.0, math.nan, 2.0], 3) == "nan"  # a seed's nan is not averaged away
    with pytest.raises(KdcollapseError, match="at least one value"):
        seeds_cell([])


def test_seeds_table_formats_each_column_with_its_digits():
    table = seeds_table(["model", "ppl", "nc1"], [("teacher", [[46.041], [2.9161]]), ("student", [[10.0, 12.0], [0.3, 0.5]])],
                        digits=[1, 3], single_digits=[2, 3])
    assert table == markdown_table(["model", "ppl", "nc1"], [["teacher", "46.04", "2.916"],
                                                             ["student", "11.0 ± 1.4", "0.400 ± 0.141"]])
    with pytest.raises(KdcollapseError, match="2 value columns"):
        seeds_table(["model", "a", "b"], [("x", [[1.0]])])


def test_paired_comparisons_correct_across_every_pair_and_metric():
    groups = {"a": {"m": [1.0, 2.0, 3.0], "n": [5.0, 5.1, 4.9]},
              "b": {"m": [0.0, 1.1, 1.9], "n": [5.0, 5.0, 5.0]},
              "c": {"m": [3.0, 4.0, 5.2], "n": [1.0, 1.2, 0.9]}}
    tests = paired_comparisons(groups, [("a", "b"), ("c", "a")], ["m", "n"], words=("higher", "lower"))
    assert [(t["a"], t["b"], t["metric"]) for t in tests] == [("a", "b", "m"), ("a", "b", "n"), ("c", "a", "m"),
                                                               ("c", "a", "n")]
    raw = [paired_t_test(groups[a][k], groups[b][k]) for a, b in (("a", "b"), ("c", "a")) for k in ("m", "n")]
    assert [t["p"] for t in tests] == [p for _, p in raw]
    assert [t["holm_p"] for t in tests] == holm([p for _, p in raw])
    assert tests[3]["difference"] == pytest.approx(-3.9667, abs=1e-4)
    assert tests[3]["verdict"] == ("lower" if tests[3]["holm_p"] < 0.05 else "no difference shown")
    assert tests[1]["verdict"] == "no difference shown"
    table = comparisons_table(tests, "comparison")
    assert table.splitlines()[0] == "| comparison | metric | paired difference | Holm p | verdict |"
    assert "| c − a | n | -3.967 |" in table


def test_fill_replaces_only_the_block_between_the_markers():
    from kdcollapse.errors import ConfigError
    from kdcollapse.report import fill

    page = "# t\n\nkept <!-- b --> inline\n<!-- b -->\nold\nlines\n<!-- e -->\n\nafter <!-- e -->\n"
    # from the first begin marker to the first end marker after it; the text around them is kept byte for byte
    assert fill(page, "<!-- b -->", "<!-- e -->", "new\n", "p has no markers") == \
        "# t\n\nkept <!-- b -->\nnew\n<!-- e -->\n\nafter <!-- e -->\n"
    page = "# t\n<!-- b -->\nold\n<!-- e -->\ntail\n"
    assert fill(page, "<!-- b -->", "<!-- e -->", "one\ntwo\n", "x") == "# t\n<!-- b -->\none\ntwo\n<!-- e -->\ntail\n"
    with pytest.raises(ConfigError, match="p.md has no markers; put the two lines\n<!-- b -->\n<!-- e -->\nwhere it goes"):
        fill("# t\n<!-- b -->\n", "<!-- b -->", "<!-- e -->", "x\n", "p.md has no markers", "where it goes")


def test_write_files_writes_what_differs_and_check_writes_nothing(tmp_path):
    from kdcollapse.runs import write_files

    same, text, image, new = tmp_path / "same.md", tmp_path / "page.md", tmp_path / "fig.png", tmp_path / "new.json"
    same.write_text("kept\n")
    text.write_text("old\n")
    image.write_bytes(b"\x89PNG old")
    files = {same: "kept\n", text: "new\n", image: b"\x89PNG new", new: "{}\n"}
    assert write_files(files, check=True) == [text, image, new]
    assert text.read_text() == "old\n" and image.read_bytes() == b"\x89PNG old" and not new.exists()
    assert write_files(files) == [text, image, new]
    assert text.read_text() == "new\n" and image.read_bytes() == b"\x89PNG new" and new.read_text() == "{}\n"
    assert write_files(files, check=True) == [] and write_files(files) == []
