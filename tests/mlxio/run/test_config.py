"""Configs: strict structuring, JSON round trip, CLI overrides."""

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxcore.train.lora import LoraConfig
from mlxcore.train.optim import OptimConfig
from mlxio.errors import ConfigError
from mlxio.run import config, flags


@attrs.frozen(kw_only=True)
class Demo:
    optim: OptimConfig = OptimConfig()
    lora: LoraConfig = LoraConfig()
    model: str | None = None
    steps: int = 3
    name: str = "run"


PRESETS = {"quick": Demo(), "smoke": Demo(steps=1, name="smoke")}
words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)


@given(
    lr=st.floats(1e-8, 1.0), rank=st.integers(1, 64), targets=st.lists(st.text("qvkoa_", min_size=1, max_size=6), max_size=4),
    model=st.none() | words, steps=st.integers(0, 10**6), rslora=st.booleans(), name=st.sampled_from(["adam", "adamw"]),
)
def test_config_json_round_trip(lr, rank, targets, model, steps, rslora, name):
    cfg = Demo(optim=OptimConfig(lr=lr, name=name), lora=LoraConfig(rank=rank, targets=tuple(targets), rslora=rslora),
               model=model, steps=steps)
    assert config.from_json(config.to_json(cfg), Demo) == cfg


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match=r"lrr.*optim"):
        config.from_dict({"optim": {"lrr": 1.0}}, Demo)
    with pytest.raises(ConfigError, match="stepz"):
        config.from_dict({"stepz": 1}, Demo)


def test_wrong_type_is_named():
    with pytest.raises(ConfigError, match="steps"):
        config.from_dict({"steps": "many"}, Demo)


def test_bad_json_names_line():
    with pytest.raises(ConfigError, match="cfg.json:2"):
        config.from_json('{\n "steps": ,\n}', Demo, "cfg.json")


def parse(argv):
    return flags.parse_args(argv, PRESETS, prog="demo", description="d", default_preset="quick")[0]


def test_cli_overrides_and_presets():
    cfg = parse(["--preset", "smoke", "--optim.lr", "1e-3", "--lora.targets", "q,v", "--model", "none",
                 "--lora.rslora", "true"])
    assert cfg == Demo(steps=1, name="smoke", optim=OptimConfig(lr=1e-3),
                       lora=LoraConfig(targets=("q", "v"), rslora=True))


def test_cli_misspelt_flag_is_an_error():
    with pytest.raises(ConfigError, match="--optim.lrr"):
        parse(["--optim.lrr", "1"])


def test_cli_abbreviations_are_errors():
    with pytest.raises(ConfigError, match="--optim.l"):
        parse(["--optim.l", "1e-4"])
    with pytest.raises(ConfigError, match="--pre"):
        parse(["--pre", "smoke"])


def test_cli_bad_value_names_flag():
    with pytest.raises(ConfigError, match="--steps"):
        parse(["--steps", "lots"])
    with pytest.raises(ConfigError, match=r"optim.name: 'sgd' is not one of 'adamw', 'adam'"):
        parse(["--optim.name", "sgd"])


def test_help_lists_every_option_with_default(capsys):
    with pytest.raises(SystemExit):
        parse(["--help"])
    out = capsys.readouterr().out
    for name in config.leaf_fields(Demo):
        assert f"--{name}" in out
    assert "(default: 2e-05)" in out and "(default: query,value)" in out


def test_config_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(config.to_json(Demo(steps=9)))
    assert parse(["--config", str(path), "--name", "x"]) == Demo(steps=9, name="x")
    path.write_text('{"steps": 1, "bogus": 2}')
    with pytest.raises(ConfigError, match=rf"bogus.*{path}"):
        parse(["--config", str(path)])


@pytest.mark.parametrize("recipe", ["xtr_lora", "rlaif_qwen"])
def test_help_says_what_every_option_does(recipe, capsys):
    """--help describes every config option (its comment or metadata), not only its default."""
    import importlib

    from mlxio.run.config import leaf_fields
    from mlxio.run.flags import field_help

    module = importlib.import_module(f"recipes.{recipe}")
    cls = type(next(iter(module.PRESETS.values())))
    helps = field_help(cls)
    assert [k for k in leaf_fields(cls) if len(helps.get(k, "")) < 8] == []
    with pytest.raises(SystemExit):
        module.main(["--help"])
    raw = capsys.readouterr().out
    text = " ".join(raw.split())
    if recipe == "xtr_lora":  # its docstring's example command lines stay one per line
        assert [line for line in raw.splitlines() if line.strip().startswith(f"python -m recipes.{recipe} --resume")]
    assert "--report_to VALUE also report each record to: \"tensorboard\"" in text
    assert "--optim.lr FLOAT peak learning rate" in text
