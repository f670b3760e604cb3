"""The ported results pages: each study file expands to the runs that the scripts it replaced trained, key for
key (the old command lines are transcribed here from the removed jobs.sh / protocol.sh / teachers.sh at
b091a42), so the committed records are those of the study's runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdcollapse.config import config_to_dict, load_config
from kdcollapse.recipes import config_file
from kdcollapse.study import load_study

ROOT = Path(__file__).resolve().parents[1]
K10 = "data.train_per_class=200 data.val_per_class=30 data.test_per_class=100"
K100 = "data.train_per_class=20 data.val_per_class=5 data.test_per_class=10"
COMMON = "data.batch_size=64 schedule.name=constant schedule.warmup_epochs=0 train.epochs=8"
LONG = "data.batch_size=64 schedule.name=constant schedule.warmup_epochs=0 train.epochs=128 train.eval_every=8 " \
       "optim.lr=0.01"
# study file -> run name -> (config, the old job line's overrides, its teacher or None)
OLD = {
    "collapse_k": {
        "collapse/k10/ce_lr0.1/seed1": ("fashion_mnist/student", f"seed=1 {K10} {COMMON} optim.lr=0.1", None),
        "collapse/k100/ce_bkl_official_a1_lr0.1_clip0.5/seed0": (
            "fashion_mnist_pairs/ce_binarykl", f"seed=0 {K100} {COMMON} optim.lr=0.1 method.alpha=1 "
            "method.binary_kl_form=official optim.grad_clip=0.5", "teacher_k100"),
        "collapse/k100/dhkd_lr0.1/seed2": ("fashion_mnist_pairs/dhkd", f"seed=2 {K100} {COMMON} optim.lr=0.1",
                                           "teacher_k100"),
    },
    "collapse_grid": {
        "collapse_grid/k10/ce_bkl_a0.3_lr0.05/seed2": (
            "fashion_mnist/ce_binarykl", f"seed=2 {K10} {COMMON} optim.lr=0.05 method.alpha=0.3", "teacher_k10"),
        "collapse_grid/k100/bkl_only_lr0.01/seed0": ("fashion_mnist_pairs/binarykl_only",
                                                     f"seed=0 {K100} {COMMON} optim.lr=0.01", "teacher_k100"),
    },
    "collapse_clip": {
        "collapse_clip/k10/ce_bkl_a10_lr0.1_clip1.0/seed1": (
            "fashion_mnist/ce_binarykl", f"seed=1 {K10} {COMMON} optim.lr=0.1 method.alpha=10 optim.grad_clip=1.0",
            "teacher_k10"),
        "collapse_clip/k100/ce_lr0.1_clip0.1/seed2": ("fashion_mnist_pairs/student",
                                                      f"seed=2 {K100} {COMMON} optim.lr=0.1 optim.grad_clip=0.1", None),
        "collapse_clip/k100/bkl_only_a30_lr0.05/seed0": (
            "fashion_mnist_pairs/binarykl_only", f"seed=0 {K100} {COMMON} optim.lr=0.05 method.alpha=30",
            "teacher_k100"),
    },
    "collapse_long": {
        "collapse_long/k100/ce_bkl_official/seed1": (
            "fashion_mnist_pairs/ce_binarykl", f"seed=1 {K100} {LONG} method.alpha=1 method.binary_kl_form=official",
            "teacher_k100"),
        "collapse_long/k10/ce/seed0": ("fashion_mnist/student", f"seed=0 {K10} {LONG}", None),
    },
}
TEACHERS = {  # teachers.sh
    "teacher_k10": ("fashion_mnist/teacher", "model.name=convnet_small seed=0 data.train_per_class=300 "
                    "data.val_per_class=30 data.test_per_class=100 data.batch_size=64 train.epochs=5"),
    "teacher_k100": ("fashion_mnist_pairs/teacher", "model.name=convnet_small seed=0 data.train_per_class=50 "
                     "data.val_per_class=5 data.test_per_class=10 data.batch_size=64 train.epochs=5"),
}


@pytest.mark.parametrize("page", sorted(OLD))
def test_collapse_studies_train_the_runs_of_the_replaced_job_lists(page, tmp_path):
    study = load_study(ROOT / f"results/distillation/{page}/study.yaml", runs_dir=tmp_path)
    runs = {**OLD[page], **{name: (*TEACHERS[name], None) for name in TEACHERS}}
    for name, (config, overrides, teacher) in runs.items():
        run = study.runs[name]
        # run_queue.py added train.progress=false; the runs' layout was channels_last=false (then the default)
        extra = [f"teacher.checkpoint={tmp_path / teacher}"] if teacher else []
        expected = load_config(config_file(config), [*overrides.split(), *extra, f"run_dir={tmp_path / name}",
                                                     "train.progress=false", "train.channels_last=false"])
        assert config_to_dict(load_config(config_file(run.config), list(run.overrides))) == config_to_dict(expected)
        assert [s.step for s in run.post] == ([] if name in TEACHERS else ["max_logit"])


IC = "configs/intra_class/fashion_mnist"
CONVNET = "results/intra_class/convnet/base.yaml"
INTRA = ("method={name: intra_class_teacher, embedding: logits, normalize: true, temperature: 0.1, "
         "margin_threshold: 0.5, cache_capacity: 64, cache_min_count: 16, intra_weight: LAM}")
# study file -> run name -> (config, the old script's overrides, the run whose directory is its teacher or None)
OLD_SCRIPTS = {  # run_fashion_mnist.sh and convnet/run.sh at b091a42
    "intra_class/fashion_mnist": {
        "teacher_l0.03/seed1": (f"{IC}/teacher.yaml", "seed=1 method.intra_weight=0.03", None),
        "student_l1/seed2": (f"{IC}/student.yaml", "seed=2", "teacher_l1/seed2"),
        "student_ce/seed0": (f"{IC}/student.yaml", "seed=0 method={name: vanilla} teacher.checkpoint=null", None),
    },
    "intra_class/convnet": {
        "teacher_l0.3/seed2": (CONVNET, f"seed=2 model.name=convnet {INTRA.replace('LAM', '0.3')}", None),
        "student_kd_l1/seed0": (CONVNET, "seed=0 model.name=convnet_small method={name: kd, ce_weight: 0.1, "
                                "kd_weight: 0.9, temperature: 1.0}", "teacher_l1/seed0"),
        "student_kdrkd_l0/seed1": (CONVNET, "seed=1 model.name=convnet_small method={name: kd_rkd}", "teacher_l0/seed1"),
        "student_ce/seed2": (CONVNET, "seed=2 model.name=convnet_small method={name: vanilla}", None),
    },
    "intra_class/convnet/teacher3000": {
        "teacher_l1/seed0": (CONVNET, f"seed=0 model.name=convnet {INTRA.replace('LAM', '1')} "
                             "data.train_per_class=3000", None),
        "student_kd_l0.1/seed2": (CONVNET, "seed=2 model.name=convnet_small method={name: kd, ce_weight: 0.1, "
                                  "kd_weight: 0.9, temperature: 1.0}", "teacher_l0.1/seed2"),
    },
}


def split_overrides(text: str) -> list[str]:
    """``key=value`` items of a command line whose values may hold spaces inside braces."""
    items, depth = [""], 0
    for ch in text:
        if ch == " " and depth == 0:
            items.append("")
            continue
        depth += ch == "{"
        depth -= ch == "}"
        items[-1] += ch
    return [i for i in items if i]


@pytest.mark.parametrize("page", sorted(OLD_SCRIPTS))
def test_intra_class_studies_train_the_runs_of_the_replaced_scripts(page, tmp_path):
    study = load_study(ROOT / f"results/{page}/study.yaml", runs_dir=tmp_path)
    for name, (config, overrides, teacher) in OLD_SCRIPTS[page].items():
        extra = [f"teacher.checkpoint={tmp_path / teacher}"] if teacher else []
        expected = load_config(ROOT / config, [*split_overrides(overrides), *extra, f"run_dir={tmp_path / name}",
                                               "train.progress=false", "train.channels_last=false"])
        run = study.runs[name]
        assert config_to_dict(load_config(config_file(run.config), list(run.overrides))) == config_to_dict(expected)


def test_ufm_seeds_runs_the_settings_of_the_replaced_driver(tmp_path):
    # the removed driver (run.py of results/geometry/ufm_seeds/ at b091a42): K, D, N = 30, 2, 2; weight_decay=5e-4, lr=0.1, log_every=steps
    old = {"sphere_gd": ("sphere", 0.02, "gd", 5000), "wd_gd": ("weight_decay", 1.0, "gd", 5000),
           "sphere_lbfgs": ("sphere", 0.02, "lbfgs", 3000), "wd_lbfgs": ("weight_decay", 1.0, "lbfgs", 3000)}
    study = load_study(ROOT / "results/geometry/ufm_seeds/study.yaml", runs_dir=tmp_path)
    assert sorted(study.runs) == sorted(f"{name}/seed{s}" for name in old for s in range(5))
    for name, (reg, tau, opt, steps) in old.items():
        assert study.runs[f"{name}/seed4"].params == {
            "num_classes": 30, "dim": 2, "samples_per_class": 2, "regularization": reg, "temperature": tau,
            "weight_decay": 5e-4, "optimizer": opt, "steps": steps, "lr": 0.1, "log_every": steps}


def test_the_geometry_studies_train_the_runs_of_the_replaced_script(tmp_path):
    # configs/geometry's removed run_experiments.sh: `kdcollapse train --config C run_dir=R --seeds S` trains R/seed<N>;
    # its heads and assignment runs are results/geometry/heads and results/geometry/assignment (names without the
    # heads/ and assignment/ folders)
    heads, assignment = ROOT / "configs/geometry/fmnist_heads.yaml", ROOT / "configs/geometry/fmnist_assignment.yaml"
    old = {"cmf/seed1": (heads, ["method.head=cmf"]), "linear/seed0": (heads, ["method.head=linear"]),
           "trainable/seed4": (assignment, []),
           "A2/seed0": (assignment, ["method.head=fixed", "method.code=softmax", "method.assignment=[0, 1, 3, 2]"])}
    studies = {heads: load_study(ROOT / "results/geometry/heads/study.yaml", runs_dir=tmp_path),
               assignment: load_study(ROOT / "results/geometry/assignment/study.yaml", runs_dir=tmp_path)}
    assert len(studies[heads].runs) == 3 * 2 and len(studies[assignment].runs) == 4 * 5
    for name, (config, overrides) in old.items():
        seed = int(name.rsplit("seed", 1)[1])
        expected = load_config(config, ["train.progress=false", *overrides, f"seed={seed}",
                                        f"run_dir={tmp_path / name}"])
        run = studies[config].runs[name]
        assert config_to_dict(load_config(config_file(run.config), list(run.overrides))) == config_to_dict(expected)


def test_the_assignment_page_s_trainable_runs_are_the_warmup_page_s_one_epoch_runs(tmp_path):
    # results/geometry/assignment/README.md says its five trainable runs are warmup's cosine_warmup1 seeds 0-4
    assignment = load_study(ROOT / "results/geometry/assignment/study.yaml", runs_dir=tmp_path)
    warmup = load_study(ROOT / "results/geometry/warmup/study.yaml", runs_dir=tmp_path)
    for seed in range(5):
        a, w = assignment.runs[f"trainable/seed{seed}"], warmup.runs[f"cosine_warmup1/seed{seed}"]
        overrides = [[o for o in r.overrides if not o.startswith("run_dir=")] for r in (a, w)]
        assert config_to_dict(load_config(config_file(a.config), overrides[0])) == \
            config_to_dict(load_config(config_file(w.config), overrides[1]))


def test_the_warmup_study_trains_the_runs_of_the_geometry_page_s_commands(tmp_path):
    # results/geometry/README.md's warm-up table: `kdcollapse train --config configs/geometry/fmnist_assignment.yaml
    # seed=N schedule.warmup_epochs=3 run_dir=...` (and schedule.warmup_epochs=1, method.head=cmf)
    study = load_study(ROOT / "results/geometry/warmup/study.yaml", runs_dir=tmp_path)
    assignment = ROOT / "configs/geometry/fmnist_assignment.yaml"
    old = {"cosine_warmup1/seed7": ["schedule.warmup_epochs=1"], "cosine_warmup3/seed8": ["schedule.warmup_epochs=3"],
           "cmf_warmup1/seed2": ["schedule.warmup_epochs=1", "method.head=cmf"]}
    assert len(study.runs) == 3 * 10
    for name, overrides in old.items():
        seed = int(name.rsplit("seed", 1)[1])
        expected = load_config(assignment, ["train.progress=false", *overrides, f"seed={seed}",
                                            f"run_dir={tmp_path / name}"])
        run = study.runs[name]
        assert config_to_dict(load_config(config_file(run.config), list(run.overrides))) == config_to_dict(expected)


def test_vci_schedules_trains_the_runs_of_the_replaced_loop(tmp_path):
    # results/collapse/vci_schedules's removed run.sh: `kdcollapse train --config base.yaml run_dir=D seed=N EXTRA`
    study = load_study(ROOT / "results/collapse/vci_schedules/study.yaml", runs_dir=tmp_path)
    extra = {"step": ["schedule.name=multistep", "schedule.milestones=[10,15]"], "cosine": [],
             "no_wd": ["optim.weight_decay=0"]}
    for name, overrides in extra.items():
        run = study.runs[f"{name}/seed2"]
        expected = load_config(ROOT / "results/collapse/vci_schedules/base.yaml",
                               [f"run_dir={tmp_path / name / 'seed2'}", "seed=2", *overrides])
        assert config_to_dict(load_config(config_file(run.config), list(run.overrides))) == config_to_dict(expected)


def test_the_fronts_study_trains_and_evaluates_the_runs_of_the_replaced_scripts(tmp_path):
    # the removed one.sh of the fronts page: train --config (the recipe fashion_mnist_trades or _ikl_at)
    # run_dir=D seed=N $DATA $overrides train.progress=false, then robust-eval with pgd, then with standard
    data = "model.name=mlp data.train_per_class=3000 train.epochs=10"
    old = {"trades_b12/seed2": ("trades", "method.beta=12"),
           "ikl_at_m5_c4/seed0": ("ikl_at", "method.mse_weight=5 method.ce_weight=4")}
    study = load_study(ROOT / "results/adversarial/fronts/study.yaml", runs_dir=tmp_path)
    assert len(study.runs) == 10 * 3
    for name, (recipe, overrides) in old.items():
        seed = int(name.rsplit("seed", 1)[1])
        expected = load_config(ROOT / f"configs/adversarial/fashion_mnist_{recipe}.yaml",
                               [f"run_dir={tmp_path / name}", f"seed={seed}", *data.split(), *overrides.split(),
                                "train.progress=false"])
        run = study.runs[name]
        assert config_to_dict(load_config(config_file(run.config), list(run.overrides))) == config_to_dict(expected)
        assert [(s.command, s.args[3], s.key) for s in run.post] == [
            ("robust-eval", "pgd", "pgd-20 Linf eps=0.1 last"),
            ("robust-eval", "standard", "autoattack-standard Linf eps=0.1 last")]


def test_a_post_step_with_a_key_is_done_once_its_file_holds_the_key(tmp_path):
    import json

    study = load_study(ROOT / "results/adversarial/fronts/study.yaml", runs_dir=tmp_path)
    pgd, aa = study.runs["trades_b1/seed0"].post
    assert not pgd.done(tmp_path)
    (tmp_path / "robust_eval.json").write_text(json.dumps({"pgd-20 Linf eps=0.1 last": {}}))
    assert pgd.done(tmp_path) and not aa.done(tmp_path)
    (tmp_path / "robust_eval.json").write_text('{"pgd-20 Linf')  # torn: run it again
    assert not pgd.done(tmp_path)


def _driver_config(run_dir, seed: int, data: dict, model: dict, method: dict, optim: dict, schedule: dict,
                   epochs: int) -> dict:
    """The dict the removed Python drivers built for ``config_from_dict``."""
    return {"run_dir": str(run_dir), "seed": seed, "data": data, "model": model, "method": method, "optim": optim,
            "schedule": schedule, "train": {"epochs": epochs, "progress": False, "device": "cpu"}}


def _study_config(run):
    return config_to_dict(load_config(config_file(run.config), list(run.overrides)))


def test_gnc_networks_trains_the_runs_of_the_replaced_driver(tmp_path):
    # kdcollapse.experiments.gnc_networks.config / grid at b0eb412 (the driver: study.py of results/geometry/gnc_networks/)
    from kdcollapse.config import config_from_dict

    study = load_study(ROOT / "results/geometry/gnc_networks/study.yaml", runs_dir=tmp_path)
    taus, dims = (0.02, 0.05, 0.1, 0.2, 0.5), (3, 5, 8, 16, 32)
    short = {(t, 16) for t in taus} | {(0.2, d) for d in dims}
    terminal = {(t, 16) for t in taus} | {(0.02, d) for d in dims}
    assert sorted(study.runs) == sorted([f"tau{t:g}_d{d}/seed{s}" for t, d in short for s in range(3)]
                                        + [f"terminal/tau{t:g}_d{d}/seed{s}" for t, d in terminal for s in range(3)])
    for name, (tau, dim, term) in {"tau0.05_d16/seed1": (0.05, 16, False), "tau0.2_d3/seed2": (0.2, 3, False),
                                   "terminal/tau0.02_d32/seed0": (0.02, 32, True)}.items():
        run = study.runs[name]
        old = _driver_config(tmp_path / name, run.values["seed"],
                             {"name": "fashion_mnist_pairs", "train_per_class": 40, "val_per_class": 10,
                              "test_per_class": 50, "batch_size": 128},
                             {"name": "mlp", "kwargs": {"hidden": [256], "bottleneck": dim, "input_size": [28, 56]}},
                             {"name": "spherical", "head": "cosine", "temperature": tau},
                             {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4} | ({"grad_clip": 1.0} if term else {}),
                             {"name": "cosine"}, 200 if term else 15)
        assert _study_config(run) == config_to_dict(config_from_dict(old))
        assert [s.step for s in run.post] == ["gnc_geometry"]


def test_gnc_2d_trains_the_runs_of_the_replaced_driver(tmp_path):
    # b1_config / b6_config of the removed study.py of results/geometry/gnc_2d/ (b0eb412); its hexagon.npy is the
    # committed one (the driver wrote the same array beside its runs)
    import numpy as np

    from kdcollapse.config import config_from_dict

    study = load_study(ROOT / "results/geometry/gnc_2d/study.yaml", runs_dir=tmp_path)
    angles = np.arange(6) * np.pi / 3
    assert np.array_equal(np.load(ROOT / "results/geometry/gnc_2d/hexagon.npy"),
                          np.stack([np.cos(angles), np.sin(angles)], 1))
    optim = {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4, "grad_clip": 1.0}
    schedule = {"name": "cosine", "warmup_epochs": 1}
    b1 = {"name": "fashion_mnist_pairs", "classes": list(range(30)), "train_per_class": 100, "val_per_class": 10,
          "test_per_class": 50, "batch_size": 128}
    b6 = {"name": "fashion_mnist", "classes": [0, 6, 5, 7, 2, 4], "train_per_class": 500, "val_per_class": 50,
          "test_per_class": 500, "batch_size": 128}
    code = "results/geometry/gnc_2d/hexagon.npy"
    old = {"b1/wd/seed3": (b1, [28, 56], {"head": "linear"}),
           "b1/sc/seed0": (b1, [28, 56], {"head": "cosine", "temperature": 0.02}),
           "b6/learned/seed4": (b6, 28, {"head": "cosine", "temperature": 0.2}),
           "b6/adjacent/seed1": (b6, 28, {"head": "fixed", "temperature": 0.2, "code": code,
                                          "assignment": [0, 1, 2, 3, 4, 5]}),
           "b6/opposite/seed2": (b6, 28, {"head": "fixed", "temperature": 0.2, "code": code,
                                          "assignment": [0, 3, 1, 4, 2, 5]})}
    assert len(study.runs) == 25
    for name, (data, size, head) in old.items():
        run = study.runs[name]
        config = _driver_config(tmp_path / name, run.values["seed"], data,
                                {"name": "mlp", "kwargs": {"hidden": [256, 64], "bottleneck": 2, "input_size": size}},
                                {"name": "spherical", **head}, optim, schedule, 100)
        assert _study_config(run) == config_to_dict(config_from_dict(config))
        assert [s.step for s in run.post] == ["circle_geometry"]


def test_vci_transfer_trains_the_runs_of_the_replaced_driver(tmp_path):
    # config() / family() of the removed study.py of results/collapse/vci_transfer/ (b0eb412)
    from kdcollapse.config import config_from_dict

    study = load_study(ROOT / "results/collapse/vci_transfer/study.yaml", runs_dir=tmp_path)
    family = [(f"tau{t:g}", {"temperature": t}) for t in (0.1, 0.2, 0.4, 0.6, 0.8, 1.0)] + \
        [(f"lambda{lam:g}", {"cosine_weight": lam}) for lam in (2.5, 3.75, 5.0, 7.5, 10.0)]
    assert sorted(study.runs) == sorted(f"{m}/seed{s}" for m, _ in family for s in range(3))
    for member, method in family:
        name = f"{member}/seed2"
        config = _driver_config(tmp_path / name, 2, {"name": "fashion_mnist", "classes": [0, 1, 2, 3, 4],
                                                     "train_per_class": 600, "val_per_class": 100,
                                                     "test_per_class": 400, "batch_size": 128},
                                {"name": "mlp", "kwargs": {"hidden": [256, 64]}}, {"name": "vanilla", **method},
                                {"lr": 0.02, "momentum": 0.9, "weight_decay": 5e-4}, {"name": "cosine"}, 10)
        assert _study_config(study.runs[name]) == config_to_dict(config_from_dict(config))
        assert [s.step for s in study.runs[name].post] == ["transfer_probes"]


def test_the_adversarial_study_trains_and_evaluates_the_runs_of_the_replaced_loop(tmp_path):
    # the loop of the adversarial page (fashion_mnist.md of results/adversarial/) at b0eb412: train --config C seed=S run_dir=D (NCHW then),
    # robust-eval D --eps 0.1 --attacks pgd --pgd-steps 20, then --attacks standard --n-examples 500
    study = load_study(ROOT / "results/adversarial/fashion_mnist/study.yaml", runs_dir=tmp_path)
    assert sorted(study.runs) == sorted(f"fmnist_{m}/seed{s}" for m in ("natural", "trades", "ikl_at") for s in (0, 1))
    for method in ("natural", "trades", "ikl_at"):
        run = study.runs[f"fmnist_{method}/seed1"]
        expected = load_config(ROOT / f"configs/adversarial/fashion_mnist_{method}.yaml",
                               ["seed=1", f"run_dir={run.run_dir}", "train.channels_last=false"])
        assert _study_config(run) == config_to_dict(expected)
        assert [(s.args, s.key) for s in run.post] == [
            (("--eps", "0.1", "--attacks", "pgd", "--pgd-steps", "20"), "pgd-20 Linf eps=0.1 last"),
            (("--eps", "0.1", "--attacks", "standard", "--n-examples", "500"), "autoattack-standard Linf eps=0.1 last")]


def test_the_bf16_study_trains_the_runs_of_the_replaced_script(tmp_path):
    # bf16_accuracy.py of results/precision/ at b0eb412, with --train-per-class 2000: the teacher recipe with the common
    # overrides, then kd / dhkd with seed, train.amp and the teacher's checkpoint
    study = load_study(ROOT / "results/precision/study.yaml", runs_dir=tmp_path)
    common = ["train.progress=false", "train.device=cpu", "data.train_per_class=2000"]
    teacher = load_config(ROOT / "configs/fashion_mnist/teacher.yaml", [*common, f"run_dir={tmp_path / 'teacher'}"])
    assert _study_config(study.runs["teacher"]) == config_to_dict(teacher)
    for method in ("kd", "dhkd"):
        for amp in ("off", "bf16"):
            name = f"{method}/{amp}/seed2"
            expected = load_config(ROOT / f"configs/fashion_mnist/{method}.yaml", [
                *common, "seed=2", f"train.amp={amp}", f"teacher.checkpoint={tmp_path / 'teacher'}",
                f"run_dir={tmp_path / name}"])
            assert _study_config(study.runs[name]) == config_to_dict(expected)


def test_the_collapse_study_trains_and_analyses_the_runs_of_the_replaced_commands(tmp_path):
    # the commands of results/collapse/README.md (b0eb412): BASE, train.epochs=5 (student15: 15), seed 0 and seeds
    # 1, 2; analyze --split test|train (the vanilla student with --teacher T; the teacher with --per-class 500 too)
    study = load_study(ROOT / "results/collapse/study.yaml", runs_dir=tmp_path)
    base = ["data.train_per_class=500", "data.test_per_class=500", "train.progress=false", "analysis.every=1",
            "train.channels_last=false"]
    teacher = tmp_path / "teacher"
    for name, (recipe, extra) in {"student/seed1": ("student", ["train.epochs=5", "seed=1"]),
                                  "dhkd/seed0": ("dhkd", ["train.epochs=5", "seed=0", f"teacher.checkpoint={teacher}"]),
                                  "student15": ("student", ["train.epochs=15", "seed=0"])}.items():
        expected = load_config(ROOT / f"configs/fashion_mnist/{recipe}.yaml",
                               [*base, *extra, f"run_dir={tmp_path / name}"])
        assert _study_config(study.runs[name]) == config_to_dict(expected)
    assert [s.args[:2] + s.args[2:-1] for s in study.runs["teacher"].post] == [
        ("--split", "test", "--per-class", "500", "--out", f"{teacher}/analysis_test_500"),
        ("--split", "train", "--per-class", "500", "--out", f"{teacher}/analysis_train_500"),
        ("--split", "test"), ("--split", "train")]
    assert study.runs["student/seed0"].post[0].args == ("--split", "test", "--teacher", str(teacher), "--no-progress")
    assert [s.creates for s in study.runs["ikl_kd/seed2"].post] == ["analysis_test/analysis.json",
                                                                   "analysis_train/analysis.json"]
