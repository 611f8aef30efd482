"""Safe GGUF reader: the header (metadata key/values, tensor infos) is walked in pure Python with
every string length, array count, dimension, type and offset bounds-checked against the file's
size before `mx.load` sees the file; every failure is a `LoadError` naming the file and key or
tensor. Part of `mlxio.weights.safeload` (see its docstring)."""

from __future__ import annotations

import math
import mmap
import os
import struct
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxio.errors import LoadError

MAX_DIM = 2**31 - 1  # MLX shapes are int32

GGUF_ALIGNMENT = 32
# ggml tensor type -> (name, weights per block, bytes per block): only the types MLX's reader
# handles (F32/F16/I8/I16/I32 copied; Q4_0/Q4_1/Q8_0 kept quantised; BF16/Q4_K/Q6_K read as
# float16 by mlx 0.32, kept quantised by some other versions).
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34), 12: ("Q4_K", 256, 144), 14: ("Q6_K", 256, 210),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 30: ("BF16", 1, 2),
}
# May be split by MLX into name.weight (packed) / name.scales / name.biases.
MLX_QUANTISED = {2, 3, 8, 12}
# GGUF metadata value type -> fixed byte size (8 = string, 9 = array handled apart).
# FLOAT64 (12) is refused: MLX's reader advances its cursor by 4 bytes for it, not 8, and
# would misread every later key.
GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8}
GGUF_STRING, GGUF_ARRAY, GGUF_UINT32 = 8, 9, 4
MAX_COUNT = 2**31 - 1  # MLX casts string and array lengths to int


class _Cursor:
    """Bounds-checked little-endian reads over a buffer; every overrun is a LoadError."""

    def __init__(self, buf, path: Path):
        self.buf, self.path, self.pos = buf, path, 0

    def left(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int, what: str) -> int:
        if n < 0 or n > self.left():
            raise LoadError(f"{self.path}: {what} at offset {self.pos} needs {n} bytes, "
                            f"only {self.left()} left in the file")
        start = self.pos
        self.pos += n
        return start

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def string(self, what: str) -> str:
        n = self.u64(f"{what} length")
        if n > MAX_COUNT:
            raise LoadError(f"{self.path}: {what} length {n} is absurd")
        start = self.take(n, what)
        try:
            return self.buf[start:start + n].decode("utf-8")  # an mmap slice is bytes
        except UnicodeDecodeError:
            raise LoadError(f"{self.path}: {what} at offset {start} is not UTF-8") from None


def _skip_gguf_value(cur: _Cursor, vtype: int, key: str) -> Any:
    """Consume one metadata value; returns scalars (needed for general.alignment)."""
    if vtype in GGUF_SCALARS:
        start = cur.take(GGUF_SCALARS[vtype], f"value of {key!r}")
        if vtype == 7 and cur.buf[start] > 1:
            raise LoadError(f"{cur.path}: bool value of {key!r} is {cur.buf[start]}, not 0/1")
        return struct.unpack_from("<I", cur.buf, start)[0] if vtype == GGUF_UINT32 else None
    if vtype == GGUF_STRING:  # decoded: MLX hands strings to Python, which needs UTF-8
        return cur.string(f"string value of {key!r}")
    if vtype == GGUF_ARRAY:
        etype = cur.u32(f"array type of {key!r}")
        count = cur.u64(f"array length of {key!r}")
        if etype == GGUF_STRING:
            if count > min(cur.left() // 8, MAX_COUNT):
                raise LoadError(f"{cur.path}: array {key!r} claims {count} strings, more than "
                                "the file can hold")
            for i in range(count):
                cur.string(f"element {i} of {key!r}")
            return None
        if etype not in GGUF_SCALARS:
            raise LoadError(f"{cur.path}: array {key!r} has unsupported element type {etype} "
                            "(nested arrays and float64 are refused)")
        if count > MAX_COUNT or count * GGUF_SCALARS[etype] > cur.left():
            raise LoadError(f"{cur.path}: array {key!r} claims {count} elements, more than "
                            "the file can hold")
        cur.take(count * GGUF_SCALARS[etype], f"array {key!r}")
        return None
    raise LoadError(f"{cur.path}: metadata {key!r} has unknown or unsupported value type "
                    f"{vtype}")


def parse_gguf_header(path: str | Path) -> list[dict]:
    """Validated GGUF tensor infos [{name, shape (MLX order), type, offset, nbytes}].

    Checks magic, version 2/3, tensor and KV counts against the file size, every string and
    array length against the bytes left, unique keys and tensor names, 1-4 dims of size
    [1, 2^31), known ggml types with rows a whole number of blocks, offsets aligned, in range
    and not overlapping.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse_gguf(_Cursor(buf, path))
    except LoadError:
        raise
    except ValueError as err:  # mmap of an empty file
        raise LoadError(f"{path}: not a GGUF file ({err})") from None
    except OSError as err:
        raise LoadError(f"{path}: cannot read ({err})") from None


def _parse_gguf(cur: _Cursor) -> list[dict]:
    path, size = cur.path, len(cur.buf)
    if size < 24 or bytes(cur.buf[:4]) != b"GGUF":
        raise LoadError(f"{path}: not a GGUF file (bad magic or shorter than 24 bytes)")
    cur.take(4, "magic")
    version = cur.u32("version")
    if version not in (2, 3):
        raise LoadError(f"{path}: GGUF version {version} unsupported (need 2 or 3)")
    n_tensors, n_kv = cur.u64("tensor count"), cur.u64("metadata count")
    # Smallest possible entries: a KV is 8 (key len) + 4 (type) + 1 (u8 value) bytes; a tensor
    # info is 8 (name len) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset).
    if n_kv > cur.left() // 13 or n_tensors > cur.left() // 32:
        raise LoadError(f"{path}: header claims {n_tensors} tensors and {n_kv} metadata "
                        f"entries, more than a {size}-byte file can hold")
    keys: set[str] = set()
    for i in range(n_kv):
        key = cur.string(f"metadata key {i}")
        if key in keys:
            raise LoadError(f"{path}: duplicate metadata key {key!r}")
        keys.add(key)
        vtype = cur.u32(f"type of {key!r}")
        value = _skip_gguf_value(cur, vtype, key)
        if key == "general.alignment" and (vtype != GGUF_UINT32 or value != GGUF_ALIGNMENT):
            # MLX's reader lays tensors out at 32-byte alignment whatever the file says.
            raise LoadError(f"{path}: general.alignment must be uint32 {GGUF_ALIGNMENT}")
    infos, names = [], set()
    for i in range(n_tensors):
        name = cur.string(f"tensor {i} name")
        if not name or name in names:
            raise LoadError(f"{path}: tensor {i} name {name!r} is empty or repeated")
        names.add(name)
        n_dims = cur.u32(f"tensor {name!r} n_dims")
        if not 1 <= n_dims <= 4:
            raise LoadError(f"{path}: tensor {name!r} has {n_dims} dims (need 1-4)")
        dims = [cur.u64(f"tensor {name!r} dim {d}") for d in range(n_dims)]
        ttype, offset = cur.u32(f"tensor {name!r} type"), cur.u64(f"tensor {name!r} offset")
        if not all(1 <= d <= MAX_DIM for d in dims):
            raise LoadError(f"{path}: tensor {name!r} dims {dims} outside [1, 2^31)")
        if ttype not in GGML_TYPES:
            raise LoadError(f"{path}: tensor {name!r} has unsupported ggml type {ttype}")
        tname, block, block_bytes = GGML_TYPES[ttype]
        if dims[0] % block:
            raise LoadError(f"{path}: tensor {name!r} row of {dims[0]} is not a whole number "
                            f"of {tname} blocks of {block}")
        if ttype in MLX_QUANTISED and not name.endswith(".weight"):
            raise LoadError(f"{path}: quantised tensor {name!r} must be named *.weight")
        if offset % GGUF_ALIGNMENT:
            raise LoadError(f"{path}: tensor {name!r} offset {offset} is not "
                            f"{GGUF_ALIGNMENT}-aligned")
        infos.append({"name": name, "shape": dims[::-1], "type": tname, "offset": offset,
                      "nbytes": math.prod(dims) // block * block_bytes,
                      "quantised": ttype in MLX_QUANTISED})
    data_start = -(-cur.pos // GGUF_ALIGNMENT) * GGUF_ALIGNMENT
    end = 0
    for info in sorted(infos, key=lambda t: t["offset"]):
        begin = data_start + info["offset"]
        if begin < end or begin + info["nbytes"] > size:
            raise LoadError(f"{path}: tensor {info['name']!r} bytes {begin}.."
                            f"{begin + info['nbytes']} overlap another tensor or run past the "
                            f"{size}-byte file")
        end = begin + info["nbytes"]
    derived = [n for t in infos if t["quantised"]
               for n in (t["name"][:-7] + ".scales", t["name"][:-7] + ".biases")]
    if len(set(derived) | names) != len(derived) + len(names):
        raise LoadError(f"{path}: quantised tensors' .scales/.biases names collide")
    return infos


def _check_gguf_arrays(path: Path, infos: list[dict], arrays: dict[str, mx.array]) -> None:
    """MLX's result must hold every tensor (quantised ones may add .scales / .biases), with the
    header's shape wherever MLX does not repack."""
    names = {t["name"] for t in infos}
    allowed = names | {t["name"][:-7] + s for t in infos if t["quantised"]
                       for s in (".scales", ".biases")}
    if not names <= set(arrays) <= allowed:
        raise LoadError(f"{path}: MLX read tensors {sorted(set(arrays) ^ names)[:5]} "
                        "differently from the header")
    for t in infos:
        packed = t["quantised"] and t["name"][:-7] + ".scales" in arrays
        if not packed and list(arrays[t["name"]].shape) != t["shape"]:
            raise LoadError(f"{path}: tensor {t['name']!r}: MLX read shape "
                            f"{arrays[t['name']].shape}, header says {t['shape']}")


def read_gguf(path: str | Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """({name: mx.array}, metadata) from a GGUF file validated by `parse_gguf_header`.

    Quantised tensors come back as MLX group-wise triples (`x.weight` packed uint32,
    `x.scales`, `x.biases`); metadata values are MLX's (arrays, strings, lists of strings).
    """
    path = Path(path)
    infos = parse_gguf_header(path)
    try:
        arrays, metadata = mx.load(str(path), format="gguf", return_metadata=True)
    except Exception as err:
        # MLX's gguflib opens the file read-write (O_RDWR), so a read-only file fails.
        hint = "" if os.access(path, os.W_OK) else "; the file is read-only, and MLX's GGUF " \
            "reader opens it read-write: copy it somewhere writable"
        raise LoadError(f"{path}: MLX could not read it ({err}){hint}") from None
    _check_gguf_arrays(path, infos, arrays)
    return arrays, metadata
