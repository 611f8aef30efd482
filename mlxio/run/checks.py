"""Checks of settings before anything heavy loads, each a `ConfigError` naming the field and the
file or "command line": every field of a config against its declared range and choices
(`check`; `mlxcore.fields.bounded`, undeclared numbers finite and >= 0), text that a system call
would refuse (`check_path_text`), URLs, the learning-rate schedule against the run's length, the
output folder, LoRA targets against a model's layers, and a count against a model's limit."""

from __future__ import annotations

import math
import os
import typing
from pathlib import Path
from typing import Any

import attrs

from mlxio.errors import ConfigError

INT_MAX = 2**31 - 1  # MLX indexes and counts in int32


def fields_of(cls: type) -> dict[str, Any]:
    """{field name: its resolved type} of an attrs class."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in attrs.fields(cls)}


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
    kinds = fields_of(type(cfg))
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
