"""The papers' CIFAR-100 tables as study files (studies/papers): the committed files are their generator's
output, every run reads as it would train, each cell carries the number its recipe's header names, each group asks
SLURM for one GPU per run, and a tiny variant of the same files runs end to end on fake CIFAR-format data, from
teachers converted out of a tar of the format of mdistiller's cifar_teachers.tar, into a page with the published
number beside each cell: DHKD's row in this process, every row through the one-node SLURM cluster (heavy)."""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml

from kdcollapse.cli import main
from kdcollapse.distributed import hardware
from kdcollapse.runs import run_state
from kdcollapse.study import array_parameters, execute, load_study, pending, submit_slurm
from lockstep import write_cifar100
from test_community_weights import write_cifar_teachers_tar
from test_study import slurm_unreachable

ROOT = Path(__file__).resolve().parents[1]
PAPERS = ROOT / "studies" / "papers"


def generator():
    spec = importlib.util.spec_from_file_location("paper_studies", PAPERS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["paper_studies"] = module
    spec.loader.exec_module(module)
    return module


GEN = generator()


@functools.cache
def full(name: str):
    """A committed study file, loaded (every run's config read) once per test session."""
    return load_study(PAPERS / name / "study.yaml")


def test_the_committed_study_files_are_the_generators_output():
    assert GEN.main(["--check"]) == 0


@pytest.mark.parametrize("name", ["cifar100", "intra_class_cifar100"])
def test_every_cell_carries_the_number_its_recipe_names(name):
    """The number beside a cell is the one in the header of the recipe its runs train (an independent text: the
    recipes are written by configs/generate.py), and every run of the full protocol reads as it would train."""
    study = full(name)  # load_study reads every run's config as it would train; nothing trained or opened
    summary = study.summary
    for table in summary["tables"]:
        section = summary["sections"][table["section"]]
        values = table["columns"][0]["values"]
        assert set(values) == {c["label"] for c in section["cells"]}
        for cell in section["cells"]:
            run = next(r for r in study.runs.values() if r.group == cell["group"]
                       and all(str(r.values[k]) == str(v) for k, v in cell["where"].items()))
            header = (ROOT / "configs" / f"{run.config}.yaml").read_text().splitlines()[0]
            number = re.search(r"(\d+\.\d\d)( ± \d+\.\d\d)? % top-1", header)
            assert values[cell["label"]] == (number.group(1) if number else "—"), (cell["label"], header)
    for run in study.runs.values():  # the full protocol: 240 (intra-class: 90) epochs, recipes unchanged
        assert run.resources == GEN.GPU
        assert not any(o.startswith(("train.", "data.", "method.", "optim.")) for o in run.overrides), run.name


def test_the_published_numbers_of_the_papers():
    """A few cells against the papers (DHKD Tables 1-2, DKL Table 5, the LS paper as issue 24 quotes it), so a
    table edit cannot move them."""
    tables = {}
    for table in full("cifar100").summary["tables"]:
        tables |= table["columns"][0]["values"]
    assert tables["KD: resnet32x4 → resnet8x4"] == "73.33"
    assert tables["DKD: resnet32x4 → resnet8x4"] == "76.32"
    assert tables["DHKD: resnet32x4 → resnet8x4"] == "76.54"
    assert tables["DHKD: resnet32x4 → shufflev2"] == "77.99"
    assert tables["IKL-KD: resnet110 → resnet32"] == "74.26"  # DKL Table 5
    assert tables["ReviewKD: wrn_40_2 → wrn_40_1"] == "75.09"
    assert tables["MLKD + LS: resnet32x4 → resnet8x4"] == "78.28"
    intra = full("intra_class_cifar100").summary["tables"]
    assert intra[1]["columns"][0]["values"]["Ours+RKD: wrn_40_2 → shufflev2"] == "72.86"  # Table 2


def test_each_run_is_one_slurm_task_with_one_gpu():
    submitit = pytest.importorskip("submitit", reason="the SLURM executor needs submitit")
    run = full("cifar100").runs["dkd/resnet32x4_resnet8x4/seed0"]
    executor = submitit.AutoExecutor(folder="/nonexistent/submitit", cluster="slurm")
    executor.update_parameters(**array_parameters("cifar100:dkd", run.resources, partition="gpu", after=["41"]))
    script = executor._executor._make_submission_file_text("python -m kdcollapse", "uid")  # what sbatch is given
    for line in ("--gpus-per-node=1", "--ntasks-per-node=1", "--cpus-per-task=8", "--mem=32GB", "--time=720",
                 "--partition=gpu", "--dependency=afterany:41"):
        assert f"#SBATCH {line}\n" in script, line


def tiny(tmp_path: Path, teachers: Path, data: Path):
    """The tiny variant: the same generator, one pair and one seed, 1 epoch on 100 fake images, no GPU."""
    protocol = {"all": [f"data.root={data}", "train.epochs=1", "train.progress=false", "data.batch_size=25",
                        "data.eval_batch_size=50"],
                "crd": ["method.num_negatives=16"]}  # CRD draws negatives without replacement from 100 images
    body = GEN.cifar100(protocol, teachers=str(teachers), resources=None, seeds=(0,), runs_dir=str(tmp_path / "runs"),
                        pairs=[("resnet32x4", "resnet8x4")])
    path = tmp_path / "page" / "study.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(body, sort_keys=False, allow_unicode=True))
    return path


def page_markers(body: dict) -> str:
    """A page for ``body``: its summary's and derived tables' markers, where `study report` writes."""
    from kdcollapse.study import BEGIN, END
    from kdcollapse.study._tables import begin, end

    tables = [f"{begin(t['name'])}\n{end(t['name'])}" for t in body["summary"]["tables"]]
    return "\n".join([f"# {body['name']}", BEGIN, END, *tables]) + "\n"


def converted_tiny_study(tmp_path: Path):
    """The tiny variant, its teacher converted out of a tar of the format of mdistiller's cifar_teachers.tar."""
    write_cifar_teachers_tar(tmp_path / "cifar_teachers.tar", names=("resnet32x4",))
    assert main(["models", "convert", "--from", "mdistiller", str(tmp_path / "cifar_teachers.tar"),
                 str(tmp_path / "teachers")]) == 0
    data = write_cifar100(tmp_path / "data", per_batch=20)
    return load_study(tiny(tmp_path, tmp_path / "teachers", data)), data


def check_trained(runs, tmp_path: Path, data: Path) -> None:
    for run in runs:  # each trained from the teacher converted out of the tar, at the tiny protocol
        assert run_state(run.run_dir) == "finished", run.name
        config = yaml.safe_load((run.run_dir / "config.yaml").read_text())
        assert config["teacher"]["checkpoint"] == str(tmp_path / "teachers" / "teacher_resnet32x4"), run.name
        assert config["train"]["epochs"] == 1 and config["data"]["root"] == str(data)


@pytest.mark.slow  # 4.5 s of CPU
def test_a_row_of_the_tables_trains_from_a_converted_teacher_into_the_page(tmp_path):
    """DHKD's row, in this process (the executor's `execute`); every row through SLURM is the heavy test below."""
    study, data = converted_tiny_study(tmp_path)
    runs = [r for r in pending(study) if r.group == "dhkd"]
    assert [execute(r).status for r in runs] == ["finished"]
    check_trained(runs, tmp_path, data)
    body = yaml.safe_load(study.path.read_text())
    (study.path.parent / "README.md").write_text(page_markers(body))
    assert main(["study", "report", str(study.path)]) == 0
    page = (study.path.parent / "README.md").read_text()
    assert re.search(r"\| DHKD: resnet32x4 → resnet8x4 \| — \| \d+\.\d+ \| 76\.54 \|", page)  # measured, published
    assert "| KD: resnet32x4 → resnet8x4 | — |" not in page  # a cell without a finished run is no row yet


@pytest.mark.heavy  # 12 runs through the one-node cluster: 2.5 min on 2 loaded cores
def test_the_tables_run_through_slurm_from_converted_teachers_into_a_page(tmp_path):
    """`.ci/slurm.sh` starts the one-node cluster; without one reachable this skips and says why."""
    why = slurm_unreachable()
    if why:
        pytest.skip(why)
    pytest.importorskip("submitit", reason="the SLURM executor needs submitit (pip install 'kdcollapse[slurm]')")
    study, data = converted_tiny_study(tmp_path)
    runs = pending(study)
    assert len(runs) == 12  # KD FitNet OFD CRD ReviewKD DKD DHKD, IKL-KD, MLKD, 3 x LS
    jobs = submit_slurm(study, runs, tmp_path / "submitit", threads=1)
    outcomes = [job.result() for job in jobs]
    assert {o.status for o in outcomes} == {"finished"}, [o.message for o in outcomes if o.status != "finished"]
    check_trained(runs, tmp_path, data)
    assert pending(study) == []
    body = yaml.safe_load(study.path.read_text())
    (study.path.parent / "README.md").write_text(page_markers(body))
    assert main(["study", "report", str(study.path)]) == 0
    page = (study.path.parent / "README.md").read_text()
    assert f"Made on (the runs' run.json): 12 runs on {hardware()['cpu']} (torch CPU capability " in page
    for table in body["summary"]["tables"]:
        for label, number in table["columns"][0]["values"].items():  # measured, then published, on each row
            assert re.search(rf"\| {re.escape(label)} \| [^|]+ \| \d+\.\d+[^|]* \| {re.escape(number)} \|", page), label


def test_a_page_names_the_hardware_its_records_hold():
    from kdcollapse.study._page import made_on

    cpu = {"cpu": "AMD EPYC 9B14", "cpu_capability": "AVX512", "gpu": None, "torch": "2.13.0", "cuda": None}
    gpu = {**cpu, "gpu": "NVIDIA H200", "cuda": "12.8"}
    assert made_on({"a": {"last": {}}, "b": {"last": {}}}) == ""  # records made before run.json kept it
    assert made_on({"a": {"hardware": cpu}, "b": {"hardware": cpu}, "c": {"hardware": gpu}, "d": {"last": {}}}) == (
        "Made on (the runs' run.json): 2 runs on AMD EPYC 9B14 (torch CPU capability AVX512), no GPU, torch 2.13.0; "
        "1 run on AMD EPYC 9B14 (torch CPU capability AVX512), GPU NVIDIA H200 (CUDA 12.8), torch 2.13.0; "
        "1 run recorded without it.")


def test_the_central_claims_study_reads_as_it_would_train():
    """studies/central_k100 (issue 43 item 5, not run yet): every run's config loads, on the whole training set,
    from the committed 86.38 % K = 100 teacher, 3 seeds of each of its 7 rows."""
    study = load_study(ROOT / "studies" / "central_k100" / "study.yaml")
    assert len(study.runs) == 21 and {r.values["seed"] for r in study.runs.values()} == {0, 1, 2}
    teacher = "teacher.checkpoint=results/teachers/fashion_mnist_pairs_convnet_e30"
    for run in study.runs.values():
        assert not any(o.startswith(("data.train_per_class", "train.epochs")) for o in run.overrides), run.name
        assert (teacher in run.overrides) == (run.group != "ce"), run.name
    assert (ROOT / "results/teachers/fashion_mnist_pairs_convnet_e30/model.safetensors").is_file()
