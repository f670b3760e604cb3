"""The tables and the figure of results/lm_collapse/distilled.md from the per-model analyses
(``kdcollapse analyze --lm ... --out DIR/<model>``, run by ``make lm-collapse``):

    python results/lm_collapse/summarise.py results/lm_collapse/distilled_test_16k

Models: ``teacher`` (SmolLM2-135M), and per seed ``forward_kl_s<seed>``, ``reverse_kl_s<seed>``,
``ce_only_s<seed>`` (the students of results/lm_distillation) and ``untrained_s<seed>`` (the student's
architecture with the initialisation the seed-``<seed>`` students started from). Every model must have been
measured on the same tokens with the same classes (checked). Comparisons are paired by seed, on the last
hidden state; Holm's correction runs over every comparison printed. Writes ``DIR/summary.json`` and
``DIR/models.png`` (the library's ``plot_token_layers``) and prints the markdown tables.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from scipy.stats import spearmanr

from kdcollapse.analysis import plot_token_layers
from kdcollapse.report import holm, markdown_table, mean_std, paired_t_test, verdict

ARMS = {"forward KL": "forward_kl", "reverse KL": "reverse_kl", "cross-entropy only": "ce_only",
        "untrained": "untrained"}
KEYS = ("nc1", "cdnv", "vci", "gnc2")  # item 6's metrics; gnc2 is the classifier's, so the last hidden state's
PAIRS = [("forward KL", "cross-entropy only"), ("reverse KL", "cross-entropy only"), ("forward KL", "reverse KL"),
         ("cross-entropy only", "untrained")]


def load(directory: Path) -> tuple[dict, dict[str, list[dict]], list[int]]:
    """The teacher's analysis, each arm's analyses (in seed order) and the seeds every arm has."""
    read = lambda name: json.loads((directory / name / "analysis.json").read_text())  # noqa: E731
    teacher = read("teacher")
    seeds = sorted(int(p.name.rpartition("_s")[2]) for p in directory.glob("forward_kl_s*"))
    seeds = [s for s in seeds if all((directory / f"{arm}_s{s}" / "analysis.json").is_file() for arm in ARMS.values())]
    arms = {label: [read(f"{arm}_s{s}") for s in seeds] for label, arm in ARMS.items()}
    for label, results in arms.items():
        for seed, result in zip(seeds, results):
            if result["classes"] != teacher["classes"]:
                raise SystemExit(f"{label} seed {seed} was measured on other tokens or classes than the teacher: "
                                 f"{result['classes']} != {teacher['classes']}")
    return teacher, arms, seeds


def cell(values: list[float], digits: int) -> str:
    """mean ± std, or "nan" when a seed's value is nan (CDNV's 0/0 at the embeddings)."""
    return "nan" if any(math.isnan(v) for v in values) else mean_std(values, digits)


def last(result: dict) -> dict:
    return result["layers"][str(result["num_hidden_states"] - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path)
    args = parser.parse_args()
    teacher, arms, seeds = load(args.directory)
    c = teacher["classes"]
    print(f"seeds {seeds}; {c['tokens']} next-token positions, {c['classes_kept']} classes kept "
          f"(min_count {c['min_count']}), {c['tokens_excluded']} positions excluded\n")

    rows = [["teacher (SmolLM2-135M)", f"{teacher['perplexity']:.2f}",
             *(f"{last(teacher)[k]:.3f}" for k in KEYS)]]
    for label, results in arms.items():
        rows.append([f"{label} (3 seeds)", mean_std([r["perplexity"] for r in results], 1),
                     *(mean_std([last(r)[k] for r in results], 3) for k in KEYS)])
    print(markdown_table(["model", "perplexity", *(f"{k} (last)" for k in KEYS)], rows))

    per_layer = [[f"{key}, hidden state {layer}",
                  *(cell([r["layers"][str(layer)][key] for r in results], 3) for results in arms.values())]
                 for key in ("nc1", "cdnv", "vci", "gnc1") for layer in range(3)]
    print(markdown_table(["students, per layer", *arms], per_layer))

    tests = []
    for a, b in PAIRS:
        for key in KEYS:
            diff, p = paired_t_test([last(r)[key] for r in arms[a]], [last(r)[key] for r in arms[b]])
            tests.append({"a": a, "b": b, "metric": key, "difference": diff, "p": p})
    for test, corrected in zip(tests, holm([t["p"] for t in tests])):
        word = verdict(test["difference"], corrected)
        test |= {"holm_p": corrected, "verdict": {"better": "higher", "worse": "lower"}.get(word, word)}
    print(markdown_table(["comparison (last hidden state)", "metric", "paired difference", "Holm p", "verdict"],
                         [[f"{t['a']} − {t['b']}", t["metric"], f"{t['difference']:+.4g}", f"{t['holm_p']:.2g}",
                           t["verdict"]] for t in tests]))

    trained = [r for label, results in arms.items() if label != "untrained" for r in results]
    correlations = {}
    for key in KEYS:
        rho, p = spearmanr([last(r)[key] for r in trained], [math.log(r["perplexity"]) for r in trained])
        correlations[key] = {"spearman_rho": float(rho), "p": float(p), "models": len(trained)}
    print(markdown_table(["metric (last)", "Spearman ρ with perplexity, 9 trained students", "p (uncorrected)"],
                         [[k, f"{v['spearman_rho']:+.2f}", f"{v['p']:.2g}"] for k, v in correlations.items()]))

    figure = plot_token_layers({"teacher": [teacher], **arms}, args.directory / "models.png",
                               title=f"next-token collapse against depth, {c['tokens']} test tokens, "
                                     f"{c['classes_kept']} classes (students: mean ± std over seeds {seeds})")
    summary = {"seeds": seeds, "classes": c, "teacher": {"perplexity": teacher["perplexity"], **last(teacher)},
               "comparisons": tests, "correlation_with_log_perplexity": correlations, "figure": figure}
    (args.directory / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
