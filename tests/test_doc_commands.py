"""Every command of README.md and docs/*.md runs (issue 42), as written, on a tiny budget the test appends.

A page's commands run in order, in one scratch folder (the current directory), so a command finds what an
earlier one made (a teacher, a run to resume, a code file); recipes that name ``runs/fmnist_teacher`` find the
tiny teacher their first line says how to train. The datasets are tiny files in the official formats (IDX,
the CIFAR pickles) under ``--root``/``data.root``, the budget one epoch (``train.epochs=1``), a few examples
(``--n-examples``, ``--per-class``) or two steps. Where the page shows output without placeholders, the
command prints it. Commands this test cannot run (the suite itself, the internet, a SLURM partition) are listed
in NOT_HERE with what runs them instead; language-model, ``torchrun`` and benchmark commands run in the heavy
tests below (``pytest -m heavy``). A new command on a page is run, or this test fails."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from doc_commands import PAGES, REPO, Command, all_commands, page_commands
from formats import write_cifar, write_idx_files
from kdcollapse.cli import main

# command prefix -> why this test does not run it and what does
NOT_HERE = {
    "make demo": "the demo: tests/test_demo.py runs `kdcollapse demo`",
    "make test": "the suite itself",
    "make pages": "tests/test_study.py::test_ported_pages_* and each page's --check test",
    ".venv/bin/python -m pytest": "the suite itself",
    "kdcollapse data download": "the internet: tests/test_data_download.py serves the official files locally",
    "kdcollapse study run study.yaml --executor slurm": "a SLURM partition `gpu`: tests/test_study*.py submit to "
                                                        "the local SLURM with submitit",
    "torchrun --nproc_per_node=8 -m kdcollapse distill --config configs/imagenet/dhkd/resnet34_resnet18.yaml":
        "ImageNet and its teacher; "
        "training.md's torchrun line runs below on Fashion-MNIST",
    "torchrun --standalone --nproc_per_node=2 -m kdcollapse distill-lm": "tests/test_distill_lm_fsdp.py",
    "kdcollapse train-tokenizer": "the whole python-docs corpus or a folder of the reader's: tests/test_lm_bpe.py "
                                  "runs the command on a tiny corpus",
    "python benchmarks/fashion_mnist_small_nets.py": "a full training with no budget option (minutes); its "
        "result is results/fashion_mnist_teacher/README.md",
}
LM = ("kdcollapse distill-lm",)  # tests/test_distill_lm_data.py::test_the_docs_commands_run_on_tiny_models
HEAVY = ("torchrun", "python", ".venv/bin/python", "kdcollapse analyze --lm")
# what the heavy test appends, by program (after the command's own options: later ones win)
HEAVY_BUDGET = {"benchmarks/bench_ikl.py": ["--runs", "1", "--markdown", "bench.md"],
                "benchmarks/bench_loss_memory.py": ["--runs", "1", "--markdown", "bench.md"],
                "benchmarks/bench_data.py": ["--repeats", "1", "--samples", "1000"],
                "benchmarks/bench_train.py": ["--steps", "1", "--batches", "8", "--models", "resnet8x4"],
                "analyze": ["--max-tokens", "256", "--out", "lm_analysis"]}  # not results/
TINY_TRAIN = ["train.epochs=1", "train.progress=false", "data.num_workers=0", "train.device=cpu"]


def _starts(cmd: Command, prefixes) -> str | None:
    text = " ".join(cmd.words)
    return next((p for p in prefixes if text == p or text.startswith(p + " ")), None)


def kind(cmd: Command) -> str:
    if cmd.synopsis:
        return "synopsis"
    if _starts(cmd, NOT_HERE):
        return "not here"
    if _starts(cmd, LM):
        return "lm"
    if _starts(cmd, HEAVY):
        return "heavy"
    return "run"


COMMANDS = all_commands()


def test_the_pages_have_their_commands():
    kinds = [kind(c) for c in COMMANDS]
    assert kinds.count("run") >= 40 and kinds.count("synopsis") >= 3 and kinds.count("lm") >= 10, kinds
    unused = [p for p in NOT_HERE if not any(_starts(c, [p]) for c in COMMANDS)]
    assert unused == [], "NOT_HERE names commands no page has"


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c.synopsis], ids=lambda c: c.id)
def test_a_synopsis_names_only_options_the_command_has(cmd, capsys):
    words = cmd.words
    sub = [w for w in words[1:3] if not w.startswith(("-", "[")) and w.isidentifier() or w == "robust-eval"]
    with pytest.raises(SystemExit):
        main([*sub[:1], "--help"])
    helptext = capsys.readouterr().out
    options = {w.strip("[]").split("=")[0] for w in words if w.strip("[").startswith("--")}
    assert options and all(o in helptext for o in options), (cmd.text, sorted(o for o in options if o not in helptext))


# ---------------------------------------------------------------------------------------------------
# The scratch folder: tiny data in the official formats, the repository's committed teachers and studies
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """Tiny data and the tiny teacher the Fashion-MNIST student recipes name (``runs/fmnist_teacher``), trained
    as their first line says."""
    root = tmp_path_factory.mktemp("docs")
    write_idx_files(root / "data" / "fashion_mnist", n_train=60, n_test=20)
    write_cifar(root / "data" / "cifar100", hundred=True, packed=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        assert run_command(["train", "--config", "fashion_mnist/teacher"], root) == 0
    return root


def page_folder(page: Path, root: Path) -> Path:
    """The page's current directory: the committed teachers (read only), the tiny teacher unless the page trains
    it, a copy of the committed studies for the studies page (`study report` writes its page)."""
    folder = root / page.stem
    (folder / "results").mkdir(parents=True)
    for entry in (REPO / "results").iterdir():  # read only, but the studies the studies page reports on
        if not (page.name == "studies.md" and entry.name == "distillation"):
            os.symlink(entry, folder / "results" / entry.name)
    trains_it = any(c.words[1:4] == ["train", "--config", "configs/fashion_mnist/teacher.yaml"]
                    and not any(w.startswith("run_dir=") for w in c.words) for c in page_commands(page))
    if not trains_it:
        shutil.copytree(root / "runs" / "fmnist_teacher", folder / "runs" / "fmnist_teacher")
    if page.name == "studies.md":
        shutil.copytree(REPO / "results" / "distillation", folder / "results" / "distillation")
    return folder


def _data_root(cfg, root: Path) -> list[str]:
    tiny = {"fashion_mnist": root / "data" / "fashion_mnist", "cifar100": root / "data" / "cifar100"}
    overrides = [f"data.root={tiny[cfg.data.name]}"] if cfg.data.name in tiny else []
    if cfg.data.val_per_class:
        overrides.append("data.val_per_class=1")
    if cfg.analysis.every:
        overrides.append("analysis.train_per_class=1")
    for split in ("train", "test"):
        if getattr(cfg.data, f"{split}_per_class"):
            overrides.append(f"data.{split}_per_class=2")
    return overrides


def tiny_argv(argv: list[str], root: Path) -> list[str]:
    """``argv`` (after ``kdcollapse``) with the tiny budget appended (later options and overrides win)."""
    from kdcollapse.config import load_config
    from kdcollapse.recipes import config_file

    argv = [str(root / w[1:]) if w.startswith("/tmp/") else w for w in argv]  # the page's /tmp/x: scratch/tmp/x
    argv = [m for w in argv for m in (sorted(glob.glob(w)) or [w] if "*" in w else [w])]  # the shell's glob
    command = argv[0]
    if command in ("train", "distill") and "--resume" in argv:
        return [w if not w.startswith("train.epochs=") else "train.epochs=2" for w in argv]
    if command in ("train", "distill"):
        at = argv.index("--config")
        overrides = [w for w in argv[at + 2:] if "=" in w and not w.startswith("-")]
        cfg = load_config(config_file(argv[at + 1]), overrides)
        return [*argv, *TINY_TRAIN, *_data_root(cfg, root)]
    if command == "analyze":
        return [*argv, "--per-class", "2", "--no-progress", "--root", str(root / "data" / "fashion_mnist")]
    if command == "robust-eval":
        return [*argv, "--n-examples", "4", "--aa-iterations", "2", "--aa-queries", "10", "--pgd-steps", "2",
                "--no-progress", "--data-root", str(root / "data" / "fashion_mnist")]
    if command == "study":
        return [*argv, "--runs-dir", str(root / "no-runs")]
    if command == "geometry" and argv[1] in ("softmax-code", "tammes"):
        return [*argv, "--restarts", "1", "--steps", "5"]  # as written: the heavy test below
    return argv


def run_command(argv: list[str], root: Path) -> int:
    if argv[:2] == ["study", "run"]:  # a study's runs at their full budget: the file is read and checked whole
        from kdcollapse.errors import KdcollapseError
        from kdcollapse.study import load_study

        try:
            load_study(argv[2], runs_dir=root / "no-runs")
        except KdcollapseError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    return main(tiny_argv(argv, root))


def _previous_config(cmd: Command, page: list[Command]) -> list[str]:
    """What ``kdcollapse train ...`` stands for: the ``--config X`` of the last command before it, in a run
    directory of its own."""
    for before in reversed(page[:page.index(cmd)]):
        if "--config" in before.words:
            at = before.words.index("--config")
            return [*before.words[at:at + 2], f"run_dir=runs/line{cmd.line}"]
    raise AssertionError(f"{cmd.id}: `...` with no command before it")


def shown_output(cmd: Command) -> list[str] | None:
    """The output the page shows, when it is exact: no placeholders, no timings or accuracies of a real run."""
    lines = [line.rstrip() for line in cmd.output if line.strip()]
    if not lines or any(t in line for line in lines for t in ("...", "<", "%", "[", " s)")):
        return None
    return lines


def check_command(cmd: Command, page: list[Command], root: Path, capsys, tiny: bool = True,
                  compare: bool = True) -> bool:
    """Run ``cmd`` (with the tiny budget if ``tiny``); compare what it prints with the page's output when the
    page shows it exactly and nothing it reads was made on a tiny budget. Whether the budget changed it."""
    words = cmd.words
    if words[0] == "ls":
        listed = sorted(os.listdir(root / words[1].removeprefix("/")))
        assert listed == sorted(" ".join(cmd.output).split()), (cmd.id, listed)
        return False
    argv = [w for part in words[1:] for w in (_previous_config(cmd, page) if part == "..." else [part])]
    capsys.readouterr()
    budget = tiny_argv(argv, root) != argv if tiny else False
    code = run_command(argv, root) if tiny else main(argv)
    out, err = capsys.readouterr()
    assert code == 0, f"{cmd.id}: `{cmd.text}` exited {code}: {err.strip()[-600:]}"
    if (expected := shown_output(cmd)) is not None and compare and not budget and "--out" not in argv:
        printed = [line.rstrip() for line in out.splitlines() if line.strip()]
        assert printed == expected, f"{cmd.id}: `{cmd.text}` printed\n" + "\n".join(printed)
    return budget


RUN_PAGES = [p for p in PAGES if any(kind(c) == "run" for c in page_commands(p))]


@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda p: p.name)
def test_the_commands_of_a_page_run_on_a_tiny_budget(page, scratch, capsys, monkeypatch):
    folder = page_folder(page, scratch)
    monkeypatch.chdir(folder)
    commands = page_commands(page)
    if page.name == "distillation.md":
        _mdistiller_checkpoint(folder)  # the file the page's reader downloads from mdistiller's releases
    shrunk = False  # once a command ran on a tiny budget, later outputs may differ from the page's
    before = _committed_results()
    for cmd in commands:
        if kind(cmd) == "run":
            shrunk |= check_command(cmd, commands, scratch, capsys, compare=not shrunk)
    assert _committed_results() == before, "a command wrote into the repository's results/"


def _committed_results() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--", "results"], cwd=REPO, capture_output=True,
                          text=True).stdout


def _mdistiller_checkpoint(root: Path) -> None:
    """The files of mdistiller's release the page converts, in its layout, with random weights."""
    from test_community_weights import Basic, OfficialResNet, write_cifar_teachers_tar

    net = OfficialResNet(Basic, [5] * 3, [64, 128, 256], 32, 100)
    torch.save({"model": net.state_dict(), "epoch": 240, "best_acc": 79.4}, root / "ckpt_epoch_240.pth")
    write_cifar_teachers_tar(root / "cifar_teachers.tar")


@pytest.mark.heavy
@pytest.mark.parametrize("cmd", [c for c in COMMANDS if kind(c) == "heavy"], ids=lambda c: c.id)
def test_a_heavy_command_runs_on_a_small_budget(cmd, scratch, tmp_path):
    """torchrun (two processes, tiny data), the benchmarks (from the repository, as the pages say) and
    ``analyze --lm`` (the real SmolLM2-135M), each in processes of its own."""
    words = cmd.words
    cwd = tmp_path
    if words[0] in ("python", ".venv/bin/python"):
        budget = [str(tmp_path / w) if w == "bench.md" else w for w in HEAVY_BUDGET[words[1]]]  # not results/
        argv, cwd = [sys.executable, *words[1:], *budget], REPO
    elif words[0] == "torchrun":
        at = words.index("kdcollapse")
        argv = [str(Path(sys.executable).parent / "torchrun"), *words[1:at], "-m", "kdcollapse",
                *tiny_argv(words[at + 1:], scratch), "run_dir=runs/ddp"]
    else:
        argv = [sys.executable, "-m", "kdcollapse", *words[1:], *HEAVY_BUDGET[words[1]]]
    shutil.copytree(scratch / "runs", tmp_path / "runs")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, (cmd.id, argv, done.stderr[-2000:])


@pytest.mark.heavy
def test_the_geometry_commands_run_as_written_and_print_the_page(scratch, capsys, monkeypatch):
    """The optimisations of the geometry page at the page's budget (minutes): what they print is the page's."""
    page = REPO / "docs" / "geometry.md"
    commands = [c for c in page_commands(page) if c.words[:2] == ["kdcollapse", "geometry"]]
    folder = scratch / "geometry_as_written"
    folder.mkdir()
    monkeypatch.chdir(folder)
    for cmd in commands:
        check_command(cmd, commands, folder, capsys, tiny=False)
