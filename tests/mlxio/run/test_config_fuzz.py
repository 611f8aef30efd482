"""Every config field of the recipes, fed wrong types, out-of-range values, NaN, empty and
huge values (as a config file would carry them, and as flags), and config files of every JSON
shape and arbitrary bytes: the outcome is a valid config, or the project's ConfigError naming
the field (or the file) - never any other exception. Every numeric option (config fields and
code_search's flags, listed from the classes and the parser) declares both ends of its range,
and a value past either end is one line naming it. Only the parse / validate layer runs."""

from __future__ import annotations

import argparse
import json
import math
import typing
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlxio.errors import ConfigError
from mlxio.run import config, flags
from recipes import code_search, rlaif_config, rlaif_judge_config, xtr_lora_config

RECIPES = {
    "xtr_lora": (xtr_lora_config.PRESETS, "quick", xtr_lora_config.validate),
    "rlaif_qwen": (rlaif_config.PRESETS, "quick", lambda cfg, source="config": rlaif_config.validate(cfg)),
    "rlaif_judge": (rlaif_judge_config.PRESETS, "quick", lambda cfg, source="config": rlaif_judge_config.validate(cfg)),
}
FIELDS = [(recipe, name) for recipe, (presets, default, _) in RECIPES.items()
          for name in config.leaf_fields(type(presets[default]))]
SECTIONS = [(recipe, name.rsplit(".", 1)[0]) for recipe, name in FIELDS if "." in name]

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(), st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, -1.0, 0.5, 1.0, 1e-300, 1e300, float("nan"), float("inf"), -float("inf")]),
    st.text(max_size=20),
    st.sampled_from(["", " ", "false", "true", "0", "1e-4", "query", "none", "nan", "\x00", "\ud800",
                     "a" * 200_000, "q_proj,v_proj", "adamw", "grpo", "float32", "*=4/64", "=", "*=99/7"]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                             max_size=3), max_leaves=8)


def _parse(recipe: str, data, source: str = "cfg.json"):
    presets, default, validate = RECIPES[recipe]
    cfg = config.from_dict(data, type(presets[default]), source, base=presets[default])
    validate(cfg, source)
    return cfg


def _nest(dotted: str, value) -> dict:
    out = value
    for part in reversed(dotted.split(".")):
        out = {part: out}
    return out


def _leaf(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _numeric_fields(cls: type, prefix: str = ""):
    """(dotted name, number type, declared check, whether a tuple of them) of every numeric leaf
    field of a config class (nested sections, Optional numbers and tuples of numbers included)."""
    hints = typing.get_type_hints(cls)
    for field in attrs.fields(cls):
        kind = hints[field.name]
        if attrs.has(kind):
            yield from _numeric_fields(kind, f"{prefix}{field.name}.")
            continue
        args = [a for a in typing.get_args(kind) if a is not type(None) and a is not Ellipsis] or [kind]
        number = next((a for a in args if a in (int, float)), None)
        if number is not None:
            yield prefix + field.name, number, dict(field.metadata.get("check", {})), typing.get_origin(kind) is tuple


NUMERIC = [(recipe, *field) for recipe, (presets, default, _) in RECIPES.items()
           for field in _numeric_fields(type(presets[default]))]
SUBCOMMANDS = next(a for a in code_search.make_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
FLAGS = [(sub, action) for sub, parser in SUBCOMMANDS.items()
         for action in parser._actions if action.type not in (None, str, Path) and action.option_strings]


def _beyond(number: type, rule: dict) -> list:
    """Values just past each declared end of a range (and NaN / infinity for floats)."""
    step = 1 if number is int else None
    out = []
    for key, bound in rule.items():
        if key not in ("gt", "ge", "lt", "le"):
            continue
        if number is int:
            out.append({"ge": math.ceil(bound) - step, "gt": math.floor(bound), "le": math.floor(bound) + step,
                        "lt": math.ceil(bound)}[key])
        else:
            nudge = max(abs(bound) * 1e-3, 1e-9)
            out.append(float({"ge": bound - nudge, "gt": bound, "le": bound + nudge, "lt": bound}[key]))
    return out + ([float("nan"), float("inf")] if number is float else [])


def test_every_numeric_option_declares_both_ends_of_its_range():
    """A numeric option bounded only by the defaults (>= 0, below 2**31 or 1e30) is an option nobody
    thought through: 10**9 steps of warm-up, a checkpoint kept forever, a 2**31-token document."""
    unbounded = [f"{recipe}: {name}" for recipe, name, _, rule, _ in NUMERIC
                 if not ({"ge", "gt"} & rule.keys() and {"le", "lt"} & rule.keys())]
    unbounded += [f"code_search {sub}: {action.option_strings[0]}" for sub, action in FLAGS
                  if not hasattr(action.type, "bounds")]
    assert unbounded == []


CASES = [pytest.param(recipe, name, [value] if many else value, id=f"{recipe}-{name}={value!r}")
         for recipe, name, number, rule, many in NUMERIC for value in _beyond(number, rule)]
CASES += [pytest.param("code_search", f"{sub} {action.option_strings[0]}", value,
                       id=f"code_search-{sub}-{action.option_strings[0]}={value}")
          for sub, action in FLAGS for value in (str(action.type.bounds[0] - 1),
                                                str(action.type.bounds[1] + (1 if isinstance(action.type.bounds[1], int)
                                                                             else 0.5)))]


@pytest.mark.parametrize("recipe, name, value", CASES)
def test_a_value_past_either_end_of_a_range_is_one_line_naming_it(recipe, name, value, capsys):
    """Generated from the config classes (every recipe, their mlxcore / mlxio sections) and
    code_search's parser, so an option added later is covered the day it lands."""
    if recipe == "code_search":
        sub, flag = name.split(" ")
        required = {"index": ["SRC", "--model", "m", "--index", "i"], "search": ["q", "--index", "i"],
                    "serve": ["--index", "i"]}[sub]
        with pytest.raises(ConfigError) as err:
            code_search.make_parser().parse_args([sub, *required, flag, value])
        assert f"argument {flag}: expected" in str(err.value) and value in str(err.value)
    else:
        with pytest.raises(ConfigError) as err:  # (a tuple of numbers: each item in the range)
            _parse(recipe, _nest(name, value))
        assert str(err.value).startswith((f"{name}: must be ", f"{name}[0]: must be ")), str(err.value)
        assert "(cfg.json)" in str(err.value)
    assert "\n" not in str(err.value)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=values)
def test_every_field_any_value_valid_or_config_error_naming_it(field, value):
    recipe, name = field
    try:
        cfg = _parse(recipe, _nest(name, value))
    except ConfigError as err:
        assert name in str(err), f"{name!r} not named in: {err}"
        assert "\n" not in str(err)
        return
    # accepted: then the value is exactly the one given, of the field's own type (no coercion)
    got = _leaf(cfg, name)
    if isinstance(value, list):
        assert got == tuple(value) and all(type(v) is str for v in value)
    elif isinstance(value, float) and type(got) is float:
        assert got == value and math.isfinite(got)
    else:
        assert got == value and type(got) is type(value) or (type(value) is int and type(got) is float)


@settings(max_examples=200, deadline=None)
@given(field=st.sampled_from(FIELDS), text=st.text(max_size=30) | st.sampled_from(
    ["nan", "inf", "-inf", "-1", "0", "1e400", "9" * 30, "", ",", "none", "true", "1.5", "\ud800"]))
def test_every_flag_any_text_valid_or_config_error_naming_it(field, text):
    recipe, name = field
    presets, default, validate = RECIPES[recipe]
    try:
        cfg, _ = flags.parse_args([f"--{name}", text], presets, prog=recipe, description="", default_preset=default)
        validate(cfg, "command line")
    except ConfigError as err:
        assert name in str(err), f"{name!r} not named in: {err}"


@settings(max_examples=150, deadline=None)
@given(section=st.sampled_from(SECTIONS), value=values)
def test_a_section_of_any_shape_is_named(section, value):
    recipe, name = section
    try:
        _parse(recipe, _nest(name, value))
    except ConfigError as err:
        assert name in str(err), f"{name!r} not named in: {err}"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=json_values | st.binary(max_size=64) | st.sampled_from(
    [b"", b"\xef\xbb\xbf{}", b"{}" * 3, b'{"a": 1, "a": 2}', b"[" * 10_000 + b"]" * 10_000, b"\xff\xfe{\x00}",
     b'{"optim": {"lr": 1e999}}', b'{"optim": {"lr": NaN}}', b'{"export": "false"}', b'{"seed": ' + b"9" * 5000 + b"}"]))
def test_config_file_of_any_json_shape_or_bytes(tmp_path_factory, recipe, doc):
    presets, default, validate = RECIPES[recipe]
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    try:
        cfg, _ = flags.parse_args(["--config", str(path)], presets, prog=recipe, description="",
                                   default_preset=default)
        validate(cfg, "command line")
    except ConfigError as err:
        assert str(path) in str(err), f"file not named in: {err}"


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_missing_sections_keep_the_presets_values(tmp_path, recipe):
    presets, _, _ = RECIPES[recipe]
    smoke = presets["smoke"]
    path = tmp_path / "c.json"
    path.write_text('{"train": {"seed": 7}}')  # both recipes: train.seed
    cfg, _ = flags.parse_args(["--preset", "smoke", "--config", str(path)], presets, prog=recipe,
                               description="", default_preset="quick")
    assert config.to_dict(cfg) == config.merge(config.to_dict(smoke), json.loads(path.read_text()), "t")
    assert cfg.optim == smoke.optim  # a section the file leaves out is the preset's, not the class default


@pytest.mark.parametrize("text, message", [
    ('{"export": "false"}', "export: expected true or false, got string 'false'"),
    ('{"lora": {"targets": "query"}}', "lora.targets: expected a list, got string 'query'"),
    ('{"train": {"steps": 1.0}}', "train.steps: expected an integer, got number 1.0"),
    ('{"train": {"checkpoint_every": 0}}', "train.checkpoint_every: must be >= 1, got 0"),
    ('{"optim": {"lr": -1}}', "optim.lr: must be > 0, got -1.0"),
    ('{"optim": {"lrr": 1}}', "unknown key 'optim.lrr'"),
    ('{"loss": {"temperature": 0}}', "loss.temperature: must be >= 0.0001"),
    ('{"lora": {"dropout": 1.0}}', "lora.dropout: must be < 1"),
    ('{"data": {"eval_fraction": NaN}}', "data.eval_fraction: must be a finite number"),
    ('{"memory": {"compute_dtype": "int8"}}', "memory.compute_dtype: 'int8' is not one of"),
    ('{"quant": {"ptq": ["*=3/99"]}}', "quant.ptq: quant rule"),
    ('{"train": 5}', "train: expected an object"),
    ("[]", "expected a JSON object of settings, got a list"),
])
def test_xtr_examples_from_the_issue(tmp_path, text, message):
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        cfg, _ = flags.parse_args(["--config", str(path)], xtr_lora_config.PRESETS, prog="x", description="",
                                   default_preset="quick")
        xtr_lora_config.validate(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("argv, message", [
    (["--optim.lr", "-1"], "optim.lr: must be > 0"),
    (["--optim.l", "1e-4"], "unrecognized arguments: --optim.l"),
    (["--temperature", "0"], "temperature: must be > 0"),
    (["--group_size", "1"], "group_size: 1 completion per prompt"),
    (["--top_p", "1.5"], "top_p: must be <= 1"),
    (["--advantage", "ppo"], "advantage: 'ppo' is not one of"),
    (["--sandbox.timeout_s", "inf"], "sandbox.timeout_s: must be a finite number"),
    (["--max_new_tokens", "0"], "max_new_tokens: must be >= 1"),
    (["--inner_epochs", "2"], "inner_epochs > 1 reuses a batch"),
])
def test_rlaif_examples(argv, message):
    with pytest.raises(ConfigError) as err:
        cfg, _ = flags.parse_args(argv, rlaif_config.PRESETS, prog="r", description="", default_preset="quick")
        rlaif_config.validate(cfg)
    assert message in str(err.value)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_preset_passes_its_own_checks(recipe):
    presets, _, validate = RECIPES[recipe]
    for name, cfg in presets.items():
        validate(cfg, f"preset {name}")  # a preset outside the declared ranges would refuse to run
