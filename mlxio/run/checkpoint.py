"""Crash-safe training checkpoints: atomic step directories, verified manifests, RNG state.

Layout of a run directory::

    run_dir/checkpoints/
        LATEST                      # one line: "step-00001200"
        step-00001200/
            params.safetensors      # one file per tree, dotted keys (mlxcore.train.tree.flatten)
            opt_state.safetensors
            meta.json               # JSON-able meta; "step" added
            manifest.json           # SHA-256 and size of every other file, and its own hash
        .tmp-step-00001300-<pid>-<hex>/   # a writer in progress (or killed): ignored, cleaned

`save` writes everything into a temp dir, fsyncs each file and the dir, renames the dir into
place, fsyncs `checkpoints/`, and only then replaces `LATEST` atomically (temp + fsync +
`os.replace`). A writer killed at any instant therefore leaves LATEST naming a complete dir
(or the previous one). `load` verifies every byte against the manifest before reading a tensor;
`load_latest` falls back to older step dirs when the newest is corrupt, and refuses (never
silently uses) a checkpoint from another config or base model.

RNG state: `rng_snapshot()` returns a plain JSON-able dict (Python `random`, NumPy's global
RandomState and MLX's global key, all as ints), so it travels inside `meta`, e.g.
`meta={"rng": rng_snapshot(), ...}` and after loading `rng_restore(meta["rng"])`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from mlxcore.train.tree import Tree, flatten, unflatten
from mlxio.atomic import (  # noqa: F401  (pid_alive: re-exported)
    check_dir_slot,
    disk_error,
    file_digest,
    fsync_path,
    open_new,
    pid_alive,
    private_dir,
    publish_dir,
    replace_file,
    run_dir,
)
from mlxio.errors import CheckpointError, LoadError
from mlxio.inputs import MiB, read_regular
from mlxio.weights.safeload import read_safetensors

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
LATEST = "LATEST"
META = "meta.json"
MANIFEST = "manifest.json"
TMP_PREFIX = ".tmp-"
FORMAT = 1
MAX_META_BYTES = 64 * MiB  # manifest.json / meta.json of one checkpoint (config, RNG state: ~100 KiB)
_STEP_DIR = re.compile(r"step-(\d{8,})")
_TREE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


# ----------------------------------------------------------------------------------- hashing

def config_hash(config_dict: dict) -> str:
    """SHA-256 hex of canonical JSON (sorted keys, no whitespace): equal configs, equal hash."""
    try:
        text = json.dumps(config_dict, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"config_hash: config is not JSON-able ({err})") from None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _json_default(obj: Any) -> Any:
    """Meta values that are JSON-able in all but type: NumPy / 1-element MLX scalars, paths."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, mx.array) and obj.size == 1:
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-able")


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")


# ------------------------------------------------------------------------------ durability

def _write_bytes(path: Path, data: bytes) -> None:
    """`data` in a new file at `path` (never through a link: `open_new`), fsynced."""
    with os.fdopen(open_new(path, "checkpoint"), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def clean_stale(ckpt_root: Path) -> list[Path]:
    """Remove temp dirs/files left by writers that are gone (killed mid-save); returns them.
    A temp entry whose writer (pid in its name) is another live process is left alone."""
    removed = []
    if not ckpt_root.is_dir():
        return removed
    for entry in ckpt_root.iterdir():
        if not entry.name.startswith(TMP_PREFIX):
            continue
        match = re.search(r"-(\d+)-[0-9a-f]+$", entry.name)
        pid = int(match.group(1)) if match else -1
        if pid != os.getpid() and pid > 0 and pid_alive(pid):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


# ------------------------------------------------------------------------------------ save

def _tree_arrays(name: str, tree: Tree) -> dict[str, mx.array]:
    """Flat {dotted key: mx.array} of one tree; refuses leaves and keys that would not load
    back as the same tree (non-arrays, dotted or all-digit dict keys, empty arrays)."""
    _check_keys(name, tree, "")
    flat = {}
    for key, leaf in flatten(tree).items():
        if isinstance(leaf, np.ndarray):
            leaf = mx.array(leaf)
        if not isinstance(leaf, mx.array):
            raise CheckpointError(f"tree {name!r}: leaf {key!r} is a {type(leaf).__name__}, "
                                  "not an array (put scalars in meta)")
        if leaf.size == 0:
            raise CheckpointError(f"tree {name!r}: leaf {key!r} is empty (shape {leaf.shape}); "
                                  "safetensors via MLX cannot store it")
        flat[key] = leaf
    return flat


def _check_keys(name: str, node: Any, path: str) -> None:
    if isinstance(node, dict):
        for key, child in node.items():
            if not isinstance(key, str) or not key or "." in key or key.isdigit():
                raise CheckpointError(f"tree {name!r}: key {key!r} under {path or '<root>'!r} "
                                      "must be a non-empty string without '.' and not all digits")
            _check_keys(name, child, f"{path}.{key}" if path else key)
    elif isinstance(node, (list, tuple)):
        for i, child in enumerate(node):
            _check_keys(name, child, f"{path}.{i}" if path else str(i))


def save(run_dir: str | Path, step: int, trees: dict[str, Tree], meta: dict,
         keep_last: int = 3) -> Path:
    """Write `run_dir/checkpoints/step-{step:08d}/` atomically, move LATEST to it, prune.

    trees: {name: params-like tree of mx.array} -> `<name>.safetensors` each (any dtype MLX
    saves: float32, bfloat16, uint64 optimizer step, int32 ...). meta: JSON-able dict (config,
    data position, RNG snapshot, base model identity ...; NumPy / MLX scalars and paths are
    converted); `meta["step"]` is set to `step`. One writer per run dir (rank 0 under
    data parallelism): a concurrent save in the same process would clean the other's temp dir.
    Keeps the `keep_last` newest step dirs (always including this one). Returns the dir.
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"save: step must be a non-negative int, got {step!r}")
    if keep_last < 1:
        raise CheckpointError(f"save: keep_last must be >= 1, got {keep_last}")
    for name in trees:
        if not isinstance(name, str) or not _TREE_NAME.fullmatch(name):
            raise CheckpointError(f"save: tree name {name!r} is not a safe file name")
    if "step" in meta and meta["step"] != step:
        raise CheckpointError(f"save: meta['step']={meta['step']!r} but step={step}")
    try:
        meta_bytes = json.dumps({**meta, "step": step}, indent=1, sort_keys=True,
                                default=_json_default).encode("utf-8")
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"save: meta is not JSON-able ({err})") from None
    flats = {name: _tree_arrays(name, tree) for name, tree in trees.items()}
    root = Path(run_dir) / CHECKPOINTS
    try:
        return _save(root, step, flats, meta_bytes, keep_last)
    except (OSError, RuntimeError) as err:  # a full disk, a read-only or vanished folder: one clear line
        disk = disk_error(err, f"checkpoint of step {step}", root / f"step-{step:08d}",
                          previous="the previous checkpoint is intact" if _step_dirs(root) else "no checkpoint was written")
        if disk is None:
            raise
        raise disk from None


def _save(root: Path, step: int, flats: dict, meta_bytes: bytes, keep_last: int) -> Path:
    run_dir(root, "checkpoints folder")  # a link there is refused, never written through
    clean_stale(root)
    final = root / f"step-{step:08d}"
    tmp = private_dir(root / f"{TMP_PREFIX}{final.name}-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        files = {}
        for name, flat in flats.items():
            path = tmp / f"{name}.safetensors"
            mx.save_safetensors(str(path), flat, metadata={"format": "mlx", "tree": name})
            fsync_path(path)
            files[path.name] = path
        _write_bytes(tmp / META, meta_bytes)
        files[META] = tmp / META
        entries = {}
        for fname, path in sorted(files.items()):
            sha, size = file_digest(path)
            entries[fname] = {"sha256": sha, "size": size}
        body = {"format": FORMAT, "step": step, "trees": sorted(flats), "files": entries}
        manifest = {**body, "manifest_sha256": hashlib.sha256(_canonical(body)).hexdigest()}
        _write_bytes(tmp / MANIFEST, _canonical(manifest))
        fsync_path(tmp)
        publish_dir(tmp)
        check_dir_slot(final, "checkpoint")
        if final.exists():  # re-saving a step (e.g. after a resume): move the old one aside
            old = root / f"{TMP_PREFIX}old-{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        fsync_path(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    pointer_tmp = root / f"{TMP_PREFIX}{LATEST}-{os.getpid()}-{secrets.token_hex(4)}"
    _write_bytes(pointer_tmp, f"{final.name}\n".encode())
    replace_file(pointer_tmp, root / LATEST, "checkpoint pointer")
    fsync_path(root)
    _prune(root, keep=final, keep_last=keep_last)
    return final


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    """[(step, dir)] of well-named step dirs, newest step first."""
    found = []
    for entry in root.iterdir() if root.is_dir() else []:
        match = _STEP_DIR.fullmatch(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


def step_numbers(run_dir: str | Path) -> list[int]:
    """Steps of the step dirs under `run_dir/checkpoints` (verified or not), newest first."""
    return [step for step, _ in _step_dirs(Path(run_dir) / CHECKPOINTS)]


def _prune(root: Path, keep: Path, keep_last: int) -> None:
    others = [d for _, d in _step_dirs(root) if d != keep]
    for old in others[keep_last - 1:]:
        shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------ load

def _read_manifest(ckpt_dir: Path) -> dict:
    path = ckpt_dir / MANIFEST
    raw = read_regular(path, what="checkpoint manifest", max_bytes=MAX_META_BYTES, error=CheckpointError,
                       fix="resume from another checkpoint, or start fresh")
    try:
        manifest = json.loads(raw)
        body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
        intact = (raw == _canonical(manifest) and manifest.get("manifest_sha256")
                  == hashlib.sha256(_canonical(body)).hexdigest())
    except (ValueError, AttributeError):
        intact = False
    if not intact:
        raise CheckpointError(f"{path}: corrupt (not the canonical JSON its own hash covers)")
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{path}: unknown manifest format {manifest.get('format')!r}")
    return manifest


def verify(ckpt_dir: str | Path) -> dict:
    """Check every file of a checkpoint dir against its manifest; returns the manifest.
    Raises CheckpointError naming the first file that is missing, resized or altered."""
    ckpt_dir = Path(ckpt_dir)
    manifest = _read_manifest(ckpt_dir)
    required = {META} | {f"{name}.safetensors" for name in manifest.get("trees", [])}
    missing = required - set(manifest["files"])
    if missing:
        raise CheckpointError(f"{ckpt_dir / MANIFEST}: does not list {sorted(missing)}")
    for fname, entry in sorted(manifest["files"].items()):
        path = ckpt_dir / fname
        if "/" in fname or fname in ("", ".", ".."):
            raise CheckpointError(f"{ckpt_dir / MANIFEST}: bad file name {fname!r}")
        if not path.is_file():
            raise CheckpointError(f"{path}: listed in the manifest but missing")
        sha, size = file_digest(path)
        if size != entry.get("size"):
            raise CheckpointError(f"{path}: size {size} != {entry.get('size')} in the manifest")
        if sha != entry.get("sha256"):
            raise CheckpointError(f"{path}: SHA-256 mismatch (file altered or corrupt)")
    return manifest


def load(ckpt_dir: str | Path) -> tuple[dict[str, Tree], dict]:
    """({name: tree}, meta) from a step dir, after `verify` has checked every byte."""
    ckpt_dir = Path(ckpt_dir)
    manifest = verify(ckpt_dir)
    try:
        meta = json.loads(read_regular(ckpt_dir / META, what="checkpoint meta", max_bytes=MAX_META_BYTES,
                                       error=CheckpointError))
    except ValueError as err:
        raise CheckpointError(f"{ckpt_dir / META}: invalid JSON ({err})") from None
    trees = {}
    for name in manifest["trees"]:
        path = ckpt_dir / f"{name}.safetensors"
        try:
            trees[name] = unflatten(read_safetensors(path))
        except LoadError as err:
            raise CheckpointError(str(err)) from None
    return trees, meta


def _check_expect(ckpt_dir: Path, meta: dict, expect: dict) -> None:
    missing = object()
    for field, want in expect.items():
        got = meta.get(field, missing)
        if got != want:
            shown = "<absent>" if got is missing else repr(got)
            raise CheckpointError(f"{ckpt_dir}: meta[{field!r}] is {shown} but this run expects "
                                  f"{want!r}; refusing a checkpoint from another run")


def load_latest(run_dir: str | Path, expect: dict | None = None
                ) -> tuple[Path, dict[str, Tree], dict] | None:
    """(step dir, trees, meta) of the newest good checkpoint, or None if there is none.

    Tries LATEST's target first, then the other step dirs newest first; a corrupt one is
    skipped with a warning naming the file at fault. `expect` ({field: value}) must match
    meta exactly, else CheckpointError naming the field and both values. If step dirs exist
    but none verifies, raises rather than letting a run silently restart from scratch.
    """
    root = Path(run_dir) / CHECKPOINTS
    candidates = [d for _, d in _step_dirs(root)]
    if not candidates:
        return None
    try:
        target = read_regular(root / LATEST, what="LATEST pointer", max_bytes=4096,
                              error=CheckpointError).decode("utf-8").strip()
    except (CheckpointError, UnicodeDecodeError):
        target = ""
    if _STEP_DIR.fullmatch(target) and (root / target) in candidates:
        candidates.remove(root / target)
        candidates.insert(0, root / target)
    elif (root / LATEST).exists():
        log.warning("%s: names %r, not a step dir here; scanning step dirs", root / LATEST,
                    target[:80])
    failures = []
    for ckpt_dir in candidates:
        try:
            trees, meta = load(ckpt_dir)
        except CheckpointError as err:
            log.warning("skipping corrupt checkpoint: %s", err)
            failures.append(str(err))
            continue
        if expect:
            _check_expect(ckpt_dir, meta, expect)
        return ckpt_dir, trees, meta
    raise CheckpointError(f"{root}: no checkpoint verifies: " + "; ".join(failures))


# ------------------------------------------------------------------------------------- RNG

def rng_snapshot() -> dict:
    """JSON-able state of Python `random`, NumPy's global RandomState and `mx.random`'s key:
    {"python": [version, [625 ints], gauss_next], "numpy": [name, [624 ints], pos, has_gauss,
    cached_gaussian], "mlx": [hi, lo]} (MLX's key is two uint32 words)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    key = np.array(mx.random.state[0]).astype(np.uint32)
    return {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.astype(np.uint32).tolist(), int(pos), int(has_gauss),
                  float(cached)],
        "mlx": [int(key[0]), int(key[1])],
    }


def rng_restore(snapshot: dict) -> None:
    """Restore the three generators so their next draws equal those after `rng_snapshot`."""
    try:
        version, internal, gauss = snapshot["python"]
        random.setstate((version, tuple(internal), gauss))
        name, keys, pos, has_gauss, cached = snapshot["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
        hi, lo = snapshot["mlx"]
        # mx.random.key(seed) is [seed >> 32, seed & 0xffffffff], so seeding with the two words
        # rebuilds the exact key (checked below in case a future MLX changes that).
        mx.random.seed((int(hi) << 32) | int(lo))
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"rng_restore: malformed snapshot ({err})") from None
    if np.array(mx.random.state[0]).tolist() != [hi, lo]:
        raise CheckpointError("rng_restore: this MLX does not rebuild keys from seeds")
