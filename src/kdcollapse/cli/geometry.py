"""``kdcollapse geometry``: softmax and Tammes codes, bounds, one-vs-rest distances, UFM experiments."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from kdcollapse.cli._common import (FIGURE_SUFFIXES, HelpFormatter, check_output, non_negative_int, positive_float,
                                   positive_int)
from kdcollapse.geometry import (SphericalCode, load_matrix, nearest_points, save_code, softmax_code,
                                 softmax_code_bounds, softmax_code_optimum, tammes_code, tammes_optimum)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "geometry",
        help="softmax/Tammes codes, bounds, exact one-vs-rest distances, UFM experiments",
        description="Classifier geometry of the generalized-neural-collapse paper (GNC).",
        formatter_class=HelpFormatter,
        epilog="Run `kdcollapse geometry COMMAND --help` for each command's options and examples.",
    )
    commands = parser.add_subparsers(dest="geometry_command", metavar="COMMAND", required=True)
    for kind, solver, what, example in (
        ("softmax-code", softmax_code, "a softmax code (max min one-vs-rest distance, GNC Def. 2.1)", "-K 100 -d 10"),
        ("tammes", tammes_code, "a Tammes code (max min pairwise distance, GNC eq. 11)", "--classes 24 --dim 3"),
    ):
        sub = _add(commands, kind, f"find {what}", f"""examples:
  kdcollapse geometry {kind} {example}
  kdcollapse geometry {kind} --classes 8 --dim 3 --restarts 16 --out code.npy --plot code.png""")
        sub.add_argument("--classes", "-K", type=positive_int, required=True, help="number of classes K")
        sub.add_argument("--dim", "-d", type=positive_int, required=True, help="dimension d")
        sub.add_argument("--restarts", type=positive_int, default=8, help="random starting points")
        sub.add_argument("--steps", type=positive_int, default=300, help="L-BFGS iterations per temperature stage")
        sub.add_argument("--seed", type=non_negative_int, default=0)
        sub.add_argument("--out", type=Path, help="save W to .safetensors or .npy; if omitted, <kind>_K<K>_d<d>.safetensors")
        sub.add_argument("--plot", type=Path, help="figure for d = 2 or 3; if omitted, --out with suffix .png")
        sub.add_argument("--no-save", action="store_true", help="only print the table")
        sub.set_defaults(func=_run_code, solver=solver)

    sub = _add(commands, "bounds", "GNC Thm 3.9 bounds on the softmax-code distance (and Thm 3.3 closed forms)", """examples:
  kdcollapse geometry bounds --classes 100 --dim 10
  kdcollapse geometry bounds --classes 10000 --dim 16 64 256 512""")
    sub.add_argument("--classes", "-K", type=positive_int, nargs="+", required=True, help="number(s) of classes K")
    sub.add_argument("--dim", "-d", type=positive_int, nargs="+", required=True, help="dimension(s) d")
    sub.set_defaults(func=_run_bounds)

    sub = _add(commands, "distance", "exact one-vs-rest distances of a classifier matrix, with certificate", """examples:
  kdcollapse geometry distance head.npy
  kdcollapse geometry distance model.safetensors --key head.weight --show 20
  kdcollapse geometry distance checkpoint.pt --key model.fc.weight --csv distances.csv""")
    sub.add_argument("file", type=Path, help="(K, d) matrix: .npy, .safetensors or .pt/.pth (weights-only)")
    sub.add_argument("--key", help="tensor name inside a .safetensors / .pt file holding several tensors")
    sub.add_argument("--tol", type=positive_float, default=1e-10, help="target certified accuracy")
    sub.add_argument("--show", type=non_negative_int, default=10, help="list the classes with the smallest distances")
    sub.add_argument("--csv", type=Path, help="write class,distance,gap rows")
    sub.set_defaults(func=_run_distance)

    sub = _add(commands, "ufm", "unconstrained-features-model experiments (GNC eq. 2 vs B.1, tau sweep, Thm 3.3)", """examples:
  kdcollapse geometry ufm --out results/geometry           # computes ufm.json (minutes), writes ufm.md and figures
  kdcollapse geometry ufm --check --out results/geometry   # page and figures what ufm.json gives? (exit 1 if not)
  kdcollapse geometry ufm --quick --out /tmp/ufm""")
    sub.add_argument("--out", type=Path, default=Path("results/geometry"), help="report directory")
    sub.add_argument("--quick", action="store_true", help="small sizes and few iterations (a smoke run)")
    sub.add_argument("--check", action="store_true", help="compute nothing, write nothing: exit 1 if ufm.md or a "
                     "figure in --out is not what its records (ufm.json) give")
    sub.add_argument("--seed", type=non_negative_int, default=0)
    sub.set_defaults(func=_run_ufm)


def _add(commands, name: str, description: str, epilog: str) -> argparse.ArgumentParser:
    return commands.add_parser(name, help=description, description=description, epilog=epilog, formatter_class=HelpFormatter)


def _run_code(args: argparse.Namespace) -> int:
    from kdcollapse.geometry import check_sizes

    check_sizes(args.classes, args.dim)  # everything checked before the search (which can take minutes)
    kind = "softmax_code" if args.solver is softmax_code else "tammes"
    if not args.no_save:
        out = check_output(args.out or Path(f"{kind}_K{args.classes}_d{args.dim}.safetensors"), "--out",
                           suffixes=(".safetensors", ".npy"))
        if args.dim in (2, 3):
            check_output(args.plot or out.with_suffix(".png"), "--plot", suffixes=FIGURE_SUFFIXES)
    code: SphericalCode = args.solver(
        args.classes, args.dim, restarts=args.restarts, steps=args.steps, seed=args.seed, progress=True
    )
    kind = "softmax_code" if code.kind == "softmax" else "tammes"
    rows = [
        ("K, d", f"{args.classes}, {args.dim}"),
        ("rho one-vs-rest (GNC2, distance)", f"{code.one_vs_rest:.10f}"),
        ("rho one-vs-one (min pairwise distance)", f"{code.one_vs_one:.10f}"),
        ("min angle (degrees)", f"{code.min_angle:.7f}"),
        ("restarts (best / worst)", f"{max(code.restart_values):.8g} / {min(code.restart_values):.8g}"),
    ]
    known = softmax_code_optimum if code.kind == "softmax" else tammes_optimum
    optimum = known(args.classes, args.dim)
    if optimum is not None:
        rows.append(("known optimum (" + ("Thm 3.3" if code.kind == "softmax" else "degrees") + ")", f"{optimum:.10f}"))
    if args.dim >= 2:
        b = softmax_code_bounds(args.classes, args.dim)
        note = "" if b.valid else "  (Thm 3.9 assumes K >= sqrt(2 pi sqrt(e) d): not proven here)"
        rows.append(("Thm 3.9 bounds on the softmax code", f"[{b.lower:.6g}, {b.upper:.6g}]{note}"))
    print(_table(rows))
    if not args.no_save:
        out = save_code(code, args.out or Path(f"{kind}_K{args.classes}_d{args.dim}.safetensors"))
        print(f"saved {out}")
        if args.dim in (2, 3):
            from kdcollapse.experiments.plots import plot_code  # matplotlib only when drawing

            value = f"rho={code.one_vs_rest:.6g}" if code.kind == "softmax" else f"min angle={code.min_angle:.6g} deg"
            title = f"{code.kind} code K={args.classes} d={args.dim}: {value}"
            print(f"plotted {plot_code(code.W, args.plot or out.with_suffix('.png'), title)}")
    return 0


def _run_bounds(args: argparse.Namespace) -> int:
    rows = [("K", "d", "lower (Thm 3.9)", "upper (Thm 3.9)", "valid", "closed form (Thm 3.3)")]
    for K in args.classes:
        for d in args.dim:
            b = softmax_code_bounds(K, d)
            exact = softmax_code_optimum(K, d)
            rows.append((K, d, f"{b.lower:.6g}", f"{b.upper:.6g}", "yes" if b.valid else "no (K too small)",
                         "-" if exact is None else f"{exact:.6g}"))
    print(_table(rows, header=True))
    return 0


def _run_distance(args: argparse.Namespace) -> int:
    if args.csv:
        check_output(args.csv, "--csv", suffixes=(".csv",))
    W = load_matrix(args.file, args.key)
    sol = nearest_points(W, tol=args.tol, progress=True)
    K, d = W.shape
    order = torch.argsort(sol.distances)
    rows = [
        ("K, d", f"{K}, {d}"),
        ("rho one-vs-rest = min distance (GNC2)", f"{sol.distances.min().item():.10f}"),
        ("mean / max distance", f"{sol.distances.mean().item():.6g} / {sol.distances.max().item():.6g}"),
        ("largest certified gap", f"{sol.gaps.max().item():.3g}"),
    ]
    optimum = softmax_code_optimum(K, d)
    if optimum is not None:
        rows.append(("softmax-code optimum (Thm 3.3)", f"{optimum:.10f}"))
    elif d >= 2:
        b = softmax_code_bounds(K, d)
        rows.append(("softmax-code bounds (Thm 3.9)", f"[{b.lower:.6g}, {b.upper:.6g}]" + ("" if b.valid else " (not proven)")))
    print(_table(rows))
    shown = [("class", "distance", "gap")] + [
        (int(k), f"{sol.distances[k].item():.10f}", f"{sol.gaps[k].item():.2g}") for k in order[: args.show]
    ]
    if args.show > 0:
        print(f"\nclasses with the smallest one-vs-rest distance:\n{_table(shown, header=True)}")
    if args.csv:
        lines = ["class,distance,gap"] + [f"{k},{v:.17g},{g:.3g}" for k, (v, g) in
                                          enumerate(zip(sol.distances.tolist(), sol.gaps.tolist()))]
        args.csv.write_text("\n".join(lines) + "\n")
        print(f"wrote {args.csv}")
    return 0


def _run_ufm(args: argparse.Namespace) -> int:
    from kdcollapse.experiments.ufm_report import write_ufm_report

    check_output(args.out, "--out", folder=True)
    changed = write_ufm_report(args.out, quick=args.quick, seed=args.seed, check=args.check)
    for path in changed:
        print(f"{'out of date' if args.check else 'wrote'}: {path}")
    return 1 if args.check and changed else 0


def _table(rows: list[tuple], header: bool = False) -> str:
    """Left-aligned columns; with ``header`` the first row is underlined."""
    rows = [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if header:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
