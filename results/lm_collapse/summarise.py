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
from kdcollapse.report import comparisons_table, markdown_table, paired_comparisons, seeds_table

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

    models = {"teacher (SmolLM2-135M)": [teacher],
              **{f"{label} ({len(results)} seeds)": results for label, results in arms.items()}}
    print(seeds_table(["model", "perplexity", *(f"{k} (last)" for k in KEYS)],
                      [(name, [[r["perplexity"] for r in results], *([last(r)[k] for r in results] for k in KEYS)])
                       for name, results in models.items()],
                      digits=[1, *[3] * len(KEYS)], single_digits=[2, *[3] * len(KEYS)]))
    print(seeds_table(["students, per layer", *arms],
                      [(f"{key}, hidden state {layer}", [[r["layers"][str(layer)][key] for r in results]
                                                         for results in arms.values()])
                       for key in ("nc1", "cdnv", "vci", "gnc1") for layer in range(3)], digits=3))

    values = {label: {key: [last(r)[key] for r in results] for key in KEYS} for label, results in arms.items()}
    tests = paired_comparisons(values, PAIRS, KEYS, words=("higher", "lower"))  # Holm over all of them
    print(comparisons_table(tests, "comparison (last hidden state)"))

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
