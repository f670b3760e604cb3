import pytest

from kdcollapse.config import RunConfig, config_to_dict, load_config
from kdcollapse.errors import ConfigError, KdcollapseError
from kdcollapse.train import learning_rate


def test_defaults_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 3\noptim:\n  lr: 0.1\n  weight_decay: 5e-4\nschedule:\n  milestones: [2, 4]\n")
    cfg = load_config(path, ["optim.lr=0.2", "train.amp=bf16", "data.root=null", "method.name=vanilla"])
    assert isinstance(cfg, RunConfig)
    assert cfg.seed == 3 and cfg.optim.lr == 0.2 and cfg.train.amp == "bf16"
    assert cfg.optim.weight_decay == 5e-4  # PyYAML reads 5e-4 as a string; the float field converts it
    assert cfg.schedule.milestones == [2, 4]
    assert cfg.method.name == "vanilla"
    assert config_to_dict(cfg)["method"] == {"name": "vanilla", "temperature": 1.0, "cosine_weight": 0.0}
    # int given for a float field is accepted and converted
    assert load_config(None, ["optim.lr=1"]).optim.lr == 1.0
    # YAML reads `off` as False; choice fields that offer "off" take it back
    assert load_config(None, ["train.amp=off"]).train.amp == "off"


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lrr=1", "unknown key 'optim.lrr' in section 'optim'. Valid keys: accumulate, grad_clip,"),
        ("bogus=1", "unknown key 'bogus' in the config. Valid keys:"),
        ("optim.lr=fast", "'optim.lr' must be float, got 'fast'"),
        ("train.epochs=2.5", "'train.epochs' must be int"),
        ("train.amp=fp8", "'train.amp' must be one of off, auto, bf16, fp16"),
        ("schedule.milestones=3", "'schedule.milestones' must be a list"),
        ("optim=3", "'optim' must be a mapping"),
        ("nonsense", "must look like key=value"),
        ("method.name=kd_typo", "unknown method 'kd_typo'"),
        ("method.alpha=4", "unknown key 'method.alpha' in section 'method'"),
    ],
)
def test_bad_config_names_the_key(override, message):
    with pytest.raises(KdcollapseError, match=None) as err:
        load_config(None, [override])
    assert message in str(err.value)


def test_missing_or_invalid_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(listy)


def test_learning_rate_schedules():
    cfg = load_config(None, ["optim.lr=0.1", "train.epochs=10", "schedule.milestones=[5,8]"])
    assert learning_rate(cfg, 0) == pytest.approx(0.1)
    assert learning_rate(cfg, 4.99) == pytest.approx(0.1)
    assert learning_rate(cfg, 5.0) == pytest.approx(0.01)
    assert learning_rate(cfg, 9.5) == pytest.approx(0.001)
    cfg = load_config(None, ["optim.lr=0.1", "train.epochs=10", "schedule.name=cosine",
                             "schedule.warmup_epochs=2", "schedule.min_lr=0.001"])
    assert learning_rate(cfg, 0) == 0.0
    assert learning_rate(cfg, 1) == pytest.approx(0.05)
    assert learning_rate(cfg, 2) == pytest.approx(0.1)
    assert learning_rate(cfg, 6) == pytest.approx(0.001 + 0.099 * 0.5)
    assert learning_rate(cfg, 10) == pytest.approx(0.001)
