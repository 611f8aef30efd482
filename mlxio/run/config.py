"""Configs: frozen attrs classes, (un)structured by one strict cattrs converter, read from JSON
(`--config` files, a run's config.json) and checked before anything heavy loads (the checks:
`mlxio.run.checks`). The command line built from them (a flag per dotted field, `--preset`,
`--config`) is `mlxio.run.flags`.

Values are typed exactly: no string -> bool, float -> int or string -> list coercion; unknown
keys are errors naming the key. Every field is checked against its declared range
(`mlxcore.fields.bounded`; undeclared numbers must be finite and >= 0). Any problem is a
`ConfigError` naming the field and the file or "command line".
"""

from __future__ import annotations

import difflib
import json
import typing
import warnings
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.v import format_exception

from mlxio.errors import ConfigError
from mlxio.lines import nesting_depth
from mlxio.run.checks import _check_leaf, check, fields_of

T = TypeVar("T")
MAX_CONFIG_BYTES = 10_000_000
MAX_DEPTH = 64


class _Bad(TypeError):
    """A value of the wrong JSON type for its field (the message says what was expected)."""


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {json.dumps(value)}"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value[:40]!r}"
    return {list: "a list", tuple: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _strict_bool(value: Any, _t: Any) -> bool:
    if type(value) is bool:
        return value
    raise _Bad(f"expected true or false, got {_kind(value)}")


def _strict_int(value: Any, _t: Any) -> int:
    if type(value) is int:
        return value
    raise _Bad(f"expected an integer, got {_kind(value)}")


def _strict_float(value: Any, _t: Any) -> float:
    if type(value) in (int, float):
        try:
            return float(value)
        except OverflowError:
            raise _Bad(f"number too large ({str(value)[:20]}...)") from None
    raise _Bad(f"expected a number, got {_kind(value)}")


def _strict_str(value: Any, _t: Any) -> str:
    if type(value) is str:
        return value
    raise _Bad(f"expected a string, got {_kind(value)}")


def _tuple_factory(kind: Any):
    (item, *rest) = typing.get_args(kind) or (Any,)

    def structure(value: Any, _t: Any) -> tuple:
        if not isinstance(value, (list, tuple)):
            raise _Bad(f"expected a list, got {_kind(value)}")
        return tuple(converter.structure(v, item) for v in value)
    return structure


converter = cattrs.Converter(forbid_extra_keys=True)
converter.register_structure_hook(bool, _strict_bool)
converter.register_structure_hook(int, _strict_int)
converter.register_structure_hook(float, _strict_float)
converter.register_structure_hook(str, _strict_str)
converter.register_structure_hook_factory(lambda t: typing.get_origin(t) is tuple, _tuple_factory)




def to_dict(cfg: Any) -> dict:
    """Config -> plain JSON-able dict."""
    return converter.unstructure(cfg)


def flat_dict(data: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {dotted key: leaf value}."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(flat_dict(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def default_values(cls: type) -> dict[str, Any]:
    """{dotted key: default} of a config class (every field has one), spelt as `flat_dict(to_dict(cfg))`
    spells values. A setting added later keeps the behaviour of the runs before it at its
    default, so a checkpoint whose recorded config lacks a key ran as with its default
    (`mlxio.run.context.resume`)."""
    return flat_dict(to_dict(cls()))


def migrate(data: dict, legacy_keys: dict[str, str | None]) -> tuple[dict, list[str]]:
    """(data with old setting names moved to their current ones, ["old -> new", ...] applied).

    legacy_keys: {old dotted key: new dotted key, or None where the setting left the config
    (it became a command-line flag)}; a config class lists its own as `LEGACY_KEYS`.
    """
    flat, applied = flat_dict(data), []
    for old, new in legacy_keys.items():
        if old in flat:
            value = flat.pop(old)
            if new is not None:  # given under its old name, so given on purpose: it wins
                flat[new] = value
            applied.append(f"{old} -> {new or '(a command-line flag now)'}")
    out: dict = {}
    for key, value in flat.items():
        set_path(out, key, value, create=True)
    return out, applied


def _check_setting_names(data: dict, source: str, prefix: str = "") -> None:
    """Every key of a settings object (at any depth) is a non-empty name without dots: the
    dotted paths that name settings (and old names' migration) are then unambiguous."""
    for key, value in data.items():
        if not isinstance(key, str) or not key or "." in key:
            raise ConfigError(f"unknown setting {prefix + str(key)!r}: setting names are "
                              "non-empty and have no dots (nest sections as JSON objects)",
                              where=source)
        if isinstance(value, dict):
            _check_setting_names(value, source, f"{prefix}{key}.")


def from_dict(data: Any, cls: type[T], source: str = "config", base: Any = None,
              prefer: frozenset[str] | set[str] = frozenset()) -> T:
    """Plain dict -> checked config; an unknown, mistyped or out-of-range key is a ConfigError
    naming it. With `base` (a config), keys `data` leaves out keep `base`'s values. Old setting
    names the class lists in `LEGACY_KEYS` are read as the current ones, with a warning."""
    if not isinstance(data, dict):
        raise ConfigError(f"expected a JSON object of settings, got {_kind(data)}", where=source)
    _check_setting_names(data, source)
    data, applied = migrate(data, getattr(cls, "LEGACY_KEYS", {}))
    if applied:  # one warning for all of them: an old config file may use many old names
        warnings.warn(f"{source}: deprecated setting names read as the current ones: {', '.join(applied)}",
                      DeprecationWarning, stacklevel=2)
    if base is not None:
        data = merge(to_dict(base), data, source)
    else:
        _check_keys(data, cls, source, "")
    _precheck_choices(data, cls, source, "")  # before attrs' own validators word it less clearly
    try:
        cfg = converter.structure(data, cls)
    except (cattrs.BaseValidationError, _Bad, TypeError, ValueError) as err:
        messages = (cattrs.transform_error(err, format_exception=_format_exception)
                    if isinstance(err, cattrs.BaseValidationError) else [str(err)])
        raise ConfigError("; ".join(_dotted(m) for m in messages), where=source) from None
    check(cfg, source, prefer=prefer)
    return cfg


def _dotted(message: str) -> str:
    """cattrs' "msg @ $.optim.lr" -> "optim.lr: msg"."""
    text, at, path = message.rpartition(" @ ")
    if not at:
        return message
    path = path.removeprefix("$").lstrip(".")
    return f"{path}: {text}" if path else text


def _format_exception(exc: BaseException, kind: Any) -> str:
    if isinstance(exc, _Bad):
        return str(exc)
    if isinstance(exc, ValueError):  # attrs validators put their message first in args
        detail = exc.args[0] if exc.args and isinstance(exc.args[0], str) else exc
        return f"{format_exception(exc, kind)} ({detail})"
    return format_exception(exc, kind)


def _check_key(key: Any, value: Any, known: dict, section: typing.Callable[[Any], bool], source: str,
               prefix: str) -> bool:
    """Whether `key` names a section (`section(known[key])`); a ConfigError naming it when it
    is not in `known` (with the closest known name), or names a section but `value` is no object."""
    if key not in known:
        close = difflib.get_close_matches(str(key), list(known), n=1)
        hint = f"did you mean '{prefix}{close[0]}'?" if close else f"known keys: {', '.join(known)}"
        raise ConfigError(f"unknown key '{prefix}{key}'", where=source, fix=hint)
    if not section(known[key]):
        return False
    if not isinstance(value, dict):
        raise ConfigError(f"{prefix}{key}: expected an object (a section of settings), got {_kind(value)}",
                          where=source)
    return True


def _check_keys(data: dict, cls: type, source: str, prefix: str) -> None:
    known = fields_of(cls)
    for key, value in data.items():
        if _check_key(key, value, known, attrs.has, source, prefix):
            _check_keys(value, known[key], source, f"{prefix}{key}.")


def _precheck_choices(data: dict, cls: type, source: str, prefix: str) -> None:
    kinds = fields_of(cls)
    for field in attrs.fields(cls):
        if field.name not in data:
            continue
        value = data[field.name]
        if attrs.has(kinds[field.name]) and isinstance(value, dict):
            _precheck_choices(value, kinds[field.name], source, f"{prefix}{field.name}.")
        choices = field.metadata.get("check", {}).get("choices")
        if choices is not None and isinstance(value, str):
            _check_leaf(prefix + field.name, kinds[field.name], value, {"choices": choices}, source)


def merge(base: dict, data: dict, source: str, prefix: str = "") -> dict:
    """`data` over `base` (nested sections merged key by key); unknown keys are ConfigErrors."""
    out = dict(base)
    for key, value in data.items():
        if _check_key(key, value, base, lambda v: isinstance(v, dict), source, prefix):
            out[key] = merge(base[key], value, source, f"{prefix}{key}.")
        else:
            out[key] = value
    return out


# ---------------------------------------------------------------- files and flags

def to_json(cfg: Any) -> str:
    return json.dumps(to_dict(cfg), indent=2, sort_keys=True)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def load_json(raw: bytes | str, source: str) -> Any:
    """A config file's bytes -> JSON value; any bytes or shape problem is a ConfigError naming
    `source` (and the line for syntax errors)."""
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file is {len(raw)} bytes, larger than {MAX_CONFIG_BYTES}", where=source,
                          fix="pass a run's config.json or a small JSON object of settings")
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise ConfigError(f"not UTF-8 text (byte {err.start})", where=source,
                              fix="save the config file as UTF-8 JSON") from None
    else:
        text = raw
    if nesting_depth(text) > MAX_DEPTH:
        raise ConfigError(f"JSON nested deeper than {MAX_DEPTH} levels", where=source,
                          fix="a config is an object of sections of settings")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as err:
        raise ConfigError(f"invalid JSON at line {err.lineno} column {err.colno}: {err.msg}",
                          where=f"{source}:{err.lineno}", fix="fix the JSON syntax") from None
    except (ValueError, RecursionError) as err:  # duplicate key, int too long
        raise ConfigError(f"invalid JSON: {str(err)[:120]}", where=source, fix="fix the JSON") from None


def from_json(text: str | bytes, cls: type[T], source: str = "config", base: Any = None) -> T:
    return from_dict(load_json(text, source), cls, source, base)


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


def set_path(data: dict, dotted: str, value: Any, create: bool = False) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        data = data.setdefault(part, {}) if create else data[part]
    data[last] = value
