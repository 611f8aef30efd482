"""Configs: frozen attrs classes, (un)structured by one strict cattrs converter, overridden
from the command line.

Every leaf field of a recipe's config gets a flag named by its dotted path
(`--optim.lr 1e-4`); `--help` lists them all with defaults; `--preset NAME` picks the base
config; `--config FILE.json` loads one (unknown keys are errors naming the key).
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.v import format_exception

from mlxio.errors import ConfigError

T = TypeVar("T")

converter = cattrs.Converter(forbid_extra_keys=True)


def to_dict(cfg: Any) -> dict:
    """Config -> plain JSON-able dict."""
    return converter.unstructure(cfg)


def from_dict(data: dict, cls: type[T], source: str = "config") -> T:
    """Plain dict -> config; an unknown or mistyped key is a ConfigError naming it."""
    try:
        return converter.structure(data, cls)
    except cattrs.ClassValidationError as err:
        messages = cattrs.transform_error(err, format_exception=_format_exception)
        raise ConfigError(f"{source}: {'; '.join(messages)}") from None


def _format_exception(exc: BaseException, kind: Any) -> str:
    if isinstance(exc, ValueError):  # attrs validators put their message first in args
        detail = exc.args[0] if exc.args and isinstance(exc.args[0], str) else exc
        return f"{format_exception(exc, kind)} ({detail})"
    return format_exception(exc, kind)


def to_json(cfg: Any) -> str:
    return json.dumps(to_dict(cfg), indent=2, sort_keys=True)


def from_json(text: str, cls: type[T], source: str = "config") -> T:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{source}:{err.lineno}: invalid JSON ({err.msg})") from None
    return from_dict(data, cls, source)


def leaf_fields(cls: type, prefix: str = "") -> dict[str, Any]:
    """{dotted name: field type} for every non-attrs field, nested classes flattened."""
    out = {}
    hints = typing.get_type_hints(cls)
    for field in attrs.fields(cls):
        kind = hints[field.name]
        if attrs.has(kind):
            out.update(leaf_fields(kind, f"{prefix}{field.name}."))
        else:
            out[prefix + field.name] = kind
    return out


def parse_value(text: str, kind: Any, name: str) -> Any:
    """A command-line string as a value of the field's type (bool, int, float, str, tuples,
    optionals, literals)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return parse_value(text, inner[0], name)
    if origin is tuple:
        parts = [p for p in text.split(",") if p.strip()]
        return tuple(parse_value(p.strip(), args[0], name) for p in parts)
    if kind is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"--{name}: expected true/false, got {text!r}")
    try:
        return kind(text)
    except (TypeError, ValueError):
        raise ConfigError(f"--{name}: expected {getattr(kind, '__name__', kind)}, got {text!r}") from None


def set_path(data: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        data = data[part]
    data[last] = value


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return str(value)


def parse_args(argv: list[str] | None, presets: dict[str, Any], *, prog: str, description: str,
               default_preset: str, extra: typing.Callable[[argparse.ArgumentParser], None] | None = None):
    """Build the recipe's config from presets, an optional JSON file and dotted flags.

    Returns (config, argparse namespace with the non-config flags that `extra` added).
    """
    cls = type(presets[default_preset])
    base = presets[default_preset]
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--preset", choices=sorted(presets), default=default_preset,
                        help="base settings; flags below override them (defaults shown are the default preset's)")
    parser.add_argument("--config", type=Path, help="JSON config file (as written in a run's config.json)")
    if extra is not None:
        extra(parser)
    base_dict = to_dict(base)
    for name, kind in leaf_fields(cls).items():
        value = base_dict
        for part in name.split("."):
            value = value[part]
        metavar = kind.__name__.upper() if isinstance(kind, type) else "VALUE"
        parser.add_argument(f"--{name}", dest=f"cfg:{name}", metavar=metavar,
                            default=argparse.SUPPRESS, help=f"(default: {_show(value)})")
    args = parser.parse_args(argv)
    data = to_dict(presets[args.preset])
    if args.config is not None:
        try:
            text = args.config.read_text()
        except OSError as err:
            raise ConfigError(f"{args.config}: {err.strerror}") from None
        data = to_dict(from_json(text, cls, str(args.config)))
    fields = leaf_fields(cls)
    for key, text in vars(args).items():
        if key.startswith("cfg:"):
            name = key[4:]
            set_path(data, name, parse_value(text, fields[name], name))
    cfg = from_dict(data, cls, "command line")
    extras = argparse.Namespace(**{k: v for k, v in vars(args).items() if not k.startswith("cfg:")})
    return cfg, extras
