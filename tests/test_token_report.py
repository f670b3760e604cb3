"""``kdcollapse token-report``: a page of next-token collapse across models from their ``analyze --lm``
outputs, with the library's tables (seeds, paired comparisons under Holm, Spearman rank correlations)."""

from __future__ import annotations

import json
import math

import pytest
from scipy.stats import spearmanr

from kdcollapse.analysis import token_report
from kdcollapse.analysis._token_report import BEGIN, END
from kdcollapse.cli import main
from kdcollapse.errors import ConfigError, KdcollapseError
from kdcollapse.report import paired_t_test, rank_correlations

CLASSES = {"tokens": 630, "classes_kept": 12, "min_count": 2, "tokens_excluded": 5}


def analysis(perplexity: float, seed: int, shift: float) -> dict:
    """An ``analyze --lm`` result of a 2-layer model: hidden states 0..2, metrics varying with seed and shift."""
    layers = {str(i): {"nc1": 0.1 * i + shift + 0.01 * seed, "cdnv": 1.0 + shift * seed, "vci": 0.8 - 0.01 * seed,
                       "gnc1": 0.3 + 0.02 * i, "gnc2": 0.2 + shift + 0.003 * seed ** 2} for i in range(3)}
    return {"classes": CLASSES, "perplexity": perplexity, "num_hidden_states": 3, "layers": layers}


@pytest.fixture
def page(tmp_path):
    directory = tmp_path / "analyses"
    models = {"teacher": analysis(40.0, 0, 0.5)}
    for prefix, shift, base in (("a", 0.0, 100.0), ("b", 0.2, 300.0)):
        for seed in range(3):
            models[f"{prefix}_s{seed}"] = analysis(base + 7 * seed ** 2, seed, shift)
    for name, result in models.items():
        (directory / name).mkdir(parents=True)
        (directory / name / "analysis.json").write_text(json.dumps(result))
    spec = tmp_path / "page.yaml"
    spec.write_text("page: page.md\ndirectory: analyses\nteacher: {label: the teacher, dir: teacher}\n"
                    "arms: {arm A: a, arm B: b}\nseeds: [0, 1, 2]\nkeys: [nc1, gnc2]\n"
                    "per_layer: {keys: [gnc1], layers: [0, 2]}\ncompare: [[arm A, arm B]]\n"
                    "correlate: {arms: [arm A, arm B], with: log_perplexity}\n")
    (tmp_path / "page.md").write_text(f"# A page\n\nprose\n\n{BEGIN}\nold\n{END}\n\nmore prose\n")
    return spec, models


def test_the_page_holds_the_library_tables_and_check_sees_staleness(page, capsys):
    spec, models = page
    assert main(["token-report", "--check", str(spec)]) == 1  # the page holds "old"
    assert main(["token-report", str(spec)]) == 0
    assert main(["token-report", "--check", str(spec)]) == 0
    text = (spec.parent / "page.md").read_text()
    assert text.startswith("# A page\n\nprose\n\n" + BEGIN) and text.endswith(END + "\n\nmore prose\n")
    assert "| the teacher | 40.00 | 0.700 | 0.700 |" in text  # last hidden state: 0.1 * 2 + 0.5
    assert "| gnc1, hidden state 2 | 0.340 ± 0.000 | 0.340 ± 0.000 |" in text
    summary = json.loads((spec.parent / "analyses" / "summary.json").read_text())
    a = [models[f"a_s{s}"]["layers"]["2"]["gnc2"] for s in range(3)]
    b = [models[f"b_s{s}"]["layers"]["2"]["gnc2"] for s in range(3)]
    test = next(t for t in summary["comparisons"] if t["metric"] == "gnc2")
    assert test["difference"] == pytest.approx(paired_t_test(a, b)[0])
    students = [models[f"{p}_s{s}"] for p in "ab" for s in range(3)]
    rho, p = exact_spearman([m["layers"]["2"]["nc1"] for m in students], [math.log(m["perplexity"]) for m in students])
    assert summary["correlation_with_log_perplexity"]["nc1"] == {"spearman_rho": pytest.approx(rho),
                                                                 "p": pytest.approx(p), "models": 6}
    assert f"| nc1 | {rho:+.2f} | {p:.2g} |" in text


def test_an_analysis_not_done_or_on_other_classes_is_refused(page):
    spec, models = page
    (spec.parent / "analyses" / "b_s2" / "analysis.json").unlink()
    with pytest.raises(KdcollapseError, match=r"1 analyses are not done \(no analysis.json\).*b_s2"):
        token_report(spec)
    other = models["b_s2"] | {"classes": CLASSES | {"classes_kept": 11}}
    (spec.parent / "analyses" / "b_s2" / "analysis.json").write_text(json.dumps(other))
    with pytest.raises(KdcollapseError, match="b_s2 was measured on other tokens or classes"):
        token_report(spec)


def test_bad_specs_and_correlations_are_one_error(page, tmp_path):
    spec, _ = page
    spec.write_text(spec.read_text().replace("compare: [[arm A, arm B]]", "compare: [[arm A, arm C]]"))
    with pytest.raises(ConfigError, match=r"compare/correlate name \['arm C'\], not arms"):
        token_report(spec)
    with pytest.raises(ConfigError, match="token report spec not found"):
        token_report(tmp_path / "nothing.yaml")
    with pytest.raises(KdcollapseError, match="equal numbers, at least 3"):
        rank_correlations({"x": [1.0, 2.0]}, [1.0, 2.0])


def test_the_committed_lm_collapse_page_is_what_the_report_writes():
    from pathlib import Path

    spec = Path(__file__).resolve().parents[1] / "results" / "lm_collapse" / "distilled.yaml"
    assert token_report(spec, check=True) == []


def exact_spearman(x, y):
    """The definition, slowly: scipy's ρ, and the share of all n! orderings of y whose |ρ| (Pearson's r of the
    ranks, y's ranks reordered) reaches it."""
    import itertools

    import numpy as np
    from scipy.stats import rankdata

    rho = spearmanr(x, y)[0]
    rx, ry = rankdata(x), rankdata(y)
    share = [abs(np.corrcoef(rx, ry[list(order)])[0, 1]) >= abs(rho) - 1e-12
             for order in itertools.permutations(range(len(y)))]
    return rho, sum(share) / len(share)


def test_spearman_p_is_exact_up_to_8_items_and_scipy_s_beyond():
    """Up to 8 items the p counts every ordering (3 items in order: 2 of 6, where the t approximation says 0);
    ties included; more items: scipy's t approximation."""
    import numpy as np

    from kdcollapse.report import spearman

    assert spearman([1, 2, 3], [5, 6, 7]) == (1.0, pytest.approx(1 / 3)) and spearmanr([1, 2, 3], [5, 6, 7])[1] == 0
    rng = np.random.default_rng(1)
    for n, ties in ((4, False), (6, True), (7, False), (8, True)):
        x = list(rng.integers(0, 3, n).astype(float) if ties else rng.normal(size=n))
        y = [v + w for v, w in zip(x, rng.normal(size=n))]
        rho, p = spearman(x, y)
        expected = exact_spearman(x, y)
        assert rho == pytest.approx(expected[0], abs=1e-12) and p == pytest.approx(expected[1], abs=1e-12)
    x, y = list(rng.normal(size=12)), list(rng.normal(size=12))
    assert spearman(x, y) == pytest.approx(tuple(spearmanr(x, y)), rel=1e-12)
    assert all(math.isnan(v) for v in spearman([1, 2], [2, 1]) + spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(KdcollapseError, match="pairs"):
        spearman([1, 2, 3], [1, 2])


def test_partial_spearman_is_the_pearson_correlation_of_rank_residuals_with_scipy_and_its_t_test():
    """Against the slow definition: ranks (scipy, ties averaged), each of x and y regressed on z's ranks by least
    squares, Pearson's r of the residuals (scipy); its p from Student's t with n − 3 degrees of freedom beyond 8
    items, and up to 8 the share of the orderings of x against the (y, z) pairs, each recomputed the slow way,
    whose |r| reaches the observed (4 items in perfect order: not p = 0)."""
    import itertools

    import numpy as np
    from scipy.stats import pearsonr, rankdata
    from scipy.stats import t as student_t

    from kdcollapse.report import partial_spearman

    def slow(x, y, z):  # nan where x's ranks are a line in z's: no residual, no partial r
        rx, ry, rz = rankdata(x), rankdata(y), rankdata(z)
        design = np.column_stack([np.ones(len(x)), rz])
        residual = [r - design @ np.linalg.lstsq(design, r, rcond=None)[0] for r in (rx, ry)]
        return math.nan if np.abs(residual[0]).max() < 1e-9 else pearsonr(*residual)[0]

    rng = np.random.default_rng(0)
    for n, ties in ((5, False), (6, True), (9, True), (20, False)):
        z = rng.integers(0, 4, n).astype(float) if ties else rng.normal(size=n)
        x, y = z + rng.normal(size=n), 2 * z + rng.normal(size=n)
        expected = slow(x, y, z)
        if n <= 8:
            permuted = [slow(x[list(order)], y, z) for order in itertools.permutations(range(n))]
            expected_p = float(np.mean([abs(r) >= abs(expected) * (1 - 1e-9) for r in permuted if not math.isnan(r)]))
        else:
            expected_p = 2 * student_t.sf(abs(expected * math.sqrt((n - 3) / (1 - expected ** 2))), n - 3)
        r, p = partial_spearman(list(x), list(y), list(z))
        assert r == pytest.approx(expected, abs=1e-12) and p == pytest.approx(expected_p, rel=1e-9)
    r, p = partial_spearman([1, 2, 3, 4], [1, 2, 3, 4], [4, 1, 3, 2])
    assert r == pytest.approx(1.0) and p == pytest.approx(2 / 22)  # itself and its mirror, of 22 with a partial r
    assert all(math.isnan(v) for v in partial_spearman([1, 2, 3], [3, 1, 2], [1, 2, 3]))  # fewer than 4 items
    with pytest.raises(KdcollapseError, match="triples"):
        partial_spearman([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3])


def test_a_correlation_controlling_for_size_reads_each_analysis_parameter_count(page):
    from kdcollapse.report import partial_spearman

    spec, models = page
    for i, name in enumerate(sorted(n for n in models if n != "teacher")):
        data = json.loads((spec.parent / "analyses" / name / "analysis.json").read_text())
        models[name]["parameters"] = [7, 3, 11, 5, 13, 2][i]
        (spec.parent / "analyses" / name / "analysis.json").write_text(json.dumps(data | {"parameters": [7, 3, 11, 5, 13, 2][i]}))
    spec.write_text(spec.read_text().replace("with: log_perplexity}", "with: log_perplexity, control: parameters}"))
    assert main(["token-report", str(spec)]) == 0
    assert "partial ρ controlling for size (parameters)" in (spec.parent / "page.md").read_text()
    summary = json.loads((spec.parent / "analyses" / "summary.json").read_text())["correlation_with_log_perplexity"]
    chosen = [models[f"{p}_s{s}"] for p in "ab" for s in range(3)]
    expected = partial_spearman([m["layers"]["2"]["nc1"] for m in chosen], [math.log(m["perplexity"]) for m in chosen],
                                [m["parameters"] for m in chosen])
    assert not math.isnan(expected[0]) and (summary["nc1"]["partial_rho"], summary["nc1"]["partial_p"]) == \
        pytest.approx(expected)
    older = {k: v for k, v in models["b_s1"].items() if k != "parameters"}  # an analysis of an older version
    (spec.parent / "analyses" / "b_s1" / "analysis.json").write_text(json.dumps(older))
    with pytest.raises(ConfigError, match="record no parameter count"):
        token_report(spec)
    spec.write_text(spec.read_text().replace("control: parameters", "control: width"))
    with pytest.raises(ConfigError, match="correlate.control 'width'; choose parameters"):
        token_report(spec)
