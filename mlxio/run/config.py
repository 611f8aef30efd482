"""Configs: frozen attrs classes, (un)structured by one strict cattrs converter, read from JSON
(`--config` files, a run's config.json) and checked before anything heavy loads. The command
line built from them (a flag per dotted field, `--preset`, `--config`) is `mlxio.run.flags`.

Values are typed exactly: no string -> bool, float -> int or string -> list coercion; unknown
keys are errors naming the key. Every field is checked against its declared range
(`mlxcore.fields.bounded`; undeclared numbers must be finite and >= 0). Any problem is a
`ConfigError` naming the field and the file or "command line".
"""

from __future__ import annotations

import difflib
import json
import math
import os
import typing
import warnings
from pathlib import Path
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.v import format_exception

from mlxio.data.lines import nesting_depth
from mlxio.errors import ConfigError

T = TypeVar("T")
INT_MAX = 2**31 - 1  # MLX indexes and counts in int32
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


def _fields_of(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in attrs.fields(cls)}


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
    known = _fields_of(cls)
    for key, value in data.items():
        if _check_key(key, value, known, attrs.has, source, prefix):
            _check_keys(value, known[key], source, f"{prefix}{key}.")


def _precheck_choices(data: dict, cls: type, source: str, prefix: str) -> None:
    kinds = _fields_of(cls)
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


# ---------------------------------------------------------------- range checks

def _range_text(rule: dict) -> str:
    parts = []
    if "gt" in rule:
        parts.append(f"> {rule['gt']}")
    if "ge" in rule:
        parts.append(f">= {rule['ge']}")
    if "lt" in rule:
        parts.append(f"< {rule['lt']}")
    if "le" in rule:
        parts.append(f"<= {rule['le']}")
    return " and ".join(parts)


def _check_text(name: str, value: str, source: str) -> None:
    if "\x00" in value:
        raise ConfigError(f"{name}: contains a NUL character", where=source, fix=f"remove it from {name}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{name}: contains a lone surrogate (not valid Unicode text)", where=source,
                          fix=f"write {name} as valid UTF-8 text") from None
    if len(value) > 100_000:
        raise ConfigError(f"{name}: {len(value)} characters is too long", where=source,
                          fix=f"set {name} to a value under 100000 characters")


def _check_leaf(name: str, kind: Any, value: Any, rule: dict, source: str) -> None:
    fix = f"set --{name} (or \"{name}\" in the config file)"
    if value is None:
        return  # Optional fields: None means "off" / "default"; the type hook allowed it
    if isinstance(value, str):
        _check_text(name, value, source)
        if rule.get("nonempty") and not value.strip():
            raise ConfigError(f"{name}: must not be empty", where=source, fix=fix + " to a non-empty value")
    if isinstance(value, tuple):
        if rule.get("nonempty") and not value:
            raise ConfigError(f"{name}: must list at least one item", where=source, fix=fix)
        for i, item in enumerate(value):
            if isinstance(item, str):
                _check_text(f"{name}[{i}]", item, source)
                if not item.strip():
                    raise ConfigError(f"{name}[{i}]: empty item", where=source, fix=fix + " without empty items")
            else:  # a list of numbers: each item within the field's range
                _check_number(f"{name}[{i}]", item, rule, source, fix)
    if "choices" in rule and value not in rule["choices"]:
        raise ConfigError(f"{name}: {value!r} is not one of {', '.join(map(repr, rule['choices']))}",
                          where=source, fix=fix + " to one of them")
    _check_number(name, value, rule, source, fix)


def _check_number(name: str, value: Any, rule: dict, source: str, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name}: must be a finite number, got {value}", where=source, fix=fix)
    bounds = {k: rule[k] for k in ("gt", "ge", "lt", "le") if k in rule}
    if not bounds and not rule.get("negative_ok"):
        bounds = {"ge": 0}
    if isinstance(value, int) and "le" not in bounds and "lt" not in bounds:
        bounds["le"] = INT_MAX
    if isinstance(value, float) and "le" not in bounds and "lt" not in bounds:
        bounds["le"] = 1e30
    failed = {k: v for k, v in bounds.items()
              if not {"gt": value > v, "ge": value >= v, "lt": value < v, "le": value <= v}[k]}
    if failed:
        want = _range_text(failed)
        raise ConfigError(f"{name}: must be {want}, got {value!r}", where=source,
                          fix=f"{fix} to a value {_range_text(bounds)}")


def check(cfg: Any, source: str = "config", prefix: str = "", prefer: frozenset[str] | set[str] = frozenset()) -> None:
    """Every field of `cfg` (nested sections too) against its declared range / choices and the
    defaults (`mlxcore.fields`); raises ConfigError naming the first field at fault (a field in
    `prefer`, e.g. the flags the user gave, before one derived from them)."""
    errors = list(_field_errors(cfg, source, prefix))
    if errors:
        raise next((err for name, err in errors if name in prefer), errors[0][1])


def _field_errors(cfg: Any, source: str, prefix: str):
    kinds = _fields_of(type(cfg))
    for field in attrs.fields(type(cfg)):
        value = getattr(cfg, field.name)
        name = prefix + field.name
        if attrs.has(type(value)):
            yield from _field_errors(value, source, name + ".")
            continue
        try:
            _check_leaf(name, kinds[field.name], value, dict(field.metadata.get("check", {})), source)
        except ConfigError as err:
            yield name, err


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


MAX_PATH_BYTES = 4095  # Linux's PATH_MAX less the NUL: a longer path fails every system call
MAX_NAME_BYTES = 255  # NAME_MAX: one component
MAX_PATH_DEPTH = 256  # components: far past any real folder, well below Python's recursion limit


def check_path_text(path: str | Path, name: str, flag: str | None = None) -> Path:
    """A path option's text within what the file system takes (total length, one component's
    length, depth: `Path.mkdir(parents=True)` recurses once per missing component), else a
    ConfigError naming the option."""
    text = str(path)
    flag = flag or f"--{name}"
    fix = f"set {flag} to a shorter path"
    if not text.strip():
        raise ConfigError(f"{name}: must not be empty", where="command line", fix=f"set {flag} to a path")
    raw = text.encode("utf-8", "replace")
    if len(raw) > MAX_PATH_BYTES:
        raise ConfigError(f"{name}: the path is {len(raw)} bytes long, more than the {MAX_PATH_BYTES} a file "
                          "system takes", where=text[:60] + "...", fix=fix)
    parts = Path(text).parts
    if len(parts) > MAX_PATH_DEPTH:
        raise ConfigError(f"{name}: the path is {len(parts)} folders deep, more than {MAX_PATH_DEPTH}",
                          where=text[:60] + "...", fix=fix)
    long = next((p for p in parts if len(p.encode("utf-8", "replace")) > MAX_NAME_BYTES), None)
    if long is not None:
        raise ConfigError(f"{name}: a path component is {len(long.encode('utf-8', 'replace'))} bytes long, more than "
                          f"{MAX_NAME_BYTES}", where=long[:60] + "...", fix=fix)
    return Path(text)


def check_url(name: str, url: str, where: str | None = None) -> None:
    """An http(s) URL with a host and, if any, a port in 1..65535 (checked before anything loads:
    a malformed one would fail only at the first request)."""
    import urllib.parse

    from mlxio.redact import redact_text

    fix = f"set --{name} to http://HOST[:PORT][/PATH], e.g. http://127.0.0.1:8080/v1"
    shown = repr(redact_text(url)[:80])  # no user:pass@ in the message
    if any(c.isspace() for c in url) or any(ord(c) < 32 for c in url):
        raise ConfigError(f"{name}: {shown} contains whitespace or control characters", where=where, fix=fix)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as err:  # "Invalid IPv6 URL", "Port out of range 0-65535", a non-numeric port
        raise ConfigError(f"{name}: {shown} is not a valid URL ({err})", where=where, fix=fix) from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"{name}: {shown} must start with http:// or https://", where=where, fix=fix)
    if not parts.hostname:
        raise ConfigError(f"{name}: {shown} names no host", where=where, fix=fix)
    if port == 0:
        raise ConfigError(f"{name}: {shown}: port 0 is not a server's port", where=where, fix=fix)


def check_schedule(optim: Any, steps: int, where: str | None = None) -> None:
    """A learning-rate schedule that reaches its peak within the run: a warm-up of at least as
    many steps as the run trains only at a fraction of `optim.lr` (1,000,000 steps of warm-up in
    a run of 80 train at 0.008% of it: a fine-tuned model equal to the untrained one)."""
    warmup = int(getattr(optim, "warmup_steps", 0))
    if warmup and warmup >= steps:
        raise ConfigError(f"optim.warmup_steps: {warmup} warm-up steps in a run of {steps} steps: the learning "
                          f"rate never reaches optim.lr (it ends at {100 * steps / warmup:.3g}% of it)", where=where,
                          fix=f"set --optim.warmup_steps below {steps} (e.g. {max(steps // 10, 0)}) or raise --train.steps")


def check_out_dir(path: str | Path, name: str) -> Path:
    """An output directory that can be created and written (checked before anything loads)."""
    path = check_path_text(path, name)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        which = "is a file" if probe == path else f"has a file on its path ({probe})"
        raise ConfigError(f"{name}: {path} {which}, not a directory", where=str(path),
                          fix=f"set --{name} to a directory path")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{name}: cannot write in {probe}", where=str(path),
                          fix=f"set --{name} to a directory you can write")
    return path


def check_targets(targets: tuple[str, ...], layer_paths: list[str], name: str = "lora.targets",
                  where: str | None = None) -> None:
    """Every LoRA target matches at least one of the model's linear layers (`layer_paths`)."""
    from mlxcore.train.lora import matches_target

    unmatched = [t for t in targets if not any(matches_target(p, (t,)) for p in layer_paths)]
    if unmatched:
        names = sorted({p.rsplit(".", 1)[-1] for p in layer_paths})
        shown = ", ".join(names[:24]) + (", ..." if len(names) > 24 else "")
        raise ConfigError(f"{name}: {', '.join(map(repr, unmatched))} matches no linear layer of the model",
                          where=where, fix=f"set --{name} to names among: {shown}")


def check_at_most(name: str, value: int, maximum: int, what: str, where: str | None = None) -> None:
    """A length setting within the model's maximum."""
    if value > maximum:
        raise ConfigError(f"{name}: {value} is more than {what} ({maximum})", where=where,
                          fix=f"set --{name} to at most {maximum}")
