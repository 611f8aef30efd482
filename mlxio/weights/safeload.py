"""Safe readers for every weights file the project opens: safetensors, GGUF, npz, torch .bin.

MLX's native readers trust the file: a safetensors header whose offsets run past the end, or a
GGUF whose string lengths or tensor types are garbage, makes `mx.load` read out of bounds,
allocate gigabytes or abort the process. So each reader here first walks the header in pure
Python, bounds-checking every length, count, dimension and offset against the file's size, and
only then hands the (now known to be consistent) file to `mx.load` / NumPy / `torch.load`.
Nothing is allocated beyond what the file itself holds. Every failure is a `LoadError` that
names the file and, where there is one, the key or tensor.

Pickles are never unpickled: torch checkpoints go through `torch.load(weights_only=True)` and
npz through `np.load(allow_pickle=False)`.
"""

from __future__ import annotations

import json
import math
import struct
import zipfile
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from mlxio.errors import LoadError
from mlxio.weights.safeload_gguf import MAX_DIM, read_gguf

# ---------------------------------------------------------------------------- safetensors

# safetensors dtype -> itemsize, for the dtypes MLX's reader maps (F64 and F8 it cannot load).
SAFETENSORS_DTYPES = {
    "BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "C64": 8,
}
MX_DTYPES = {
    "BOOL": mx.bool_, "U8": mx.uint8, "I8": mx.int8, "U16": mx.uint16, "I16": mx.int16,
    "F16": mx.float16, "BF16": mx.bfloat16, "U32": mx.uint32, "I32": mx.int32,
    "F32": mx.float32, "U64": mx.uint64, "I64": mx.int64, "C64": mx.complex64,
}
MAX_HEADER_BYTES = 100_000_000  # the Rust safetensors crate's (and MLX's) cap


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


class _DuplicateKey(ValueError):
    pass


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-standard JSON constant {name}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_safetensors_header(path: str | Path) -> tuple[dict[str, dict], dict[str, str], int]:
    """Validated header: ({key: {"dtype", "shape", "data_offsets"}}, metadata, data_start).

    Checks the 8-byte length against the file size and a 100 MB cap, strict UTF-8 JSON object,
    no duplicate keys, known dtypes, shapes of non-negative ints whose product * itemsize is the
    tensor's byte range, and byte ranges that tile the data region exactly (no gap, no overlap,
    nothing past the end).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise LoadError(f"{path}: not a safetensors file ({size} bytes, need >= 8)")
            (header_len,) = struct.unpack("<Q", head)
            if header_len < 2 or header_len > min(size - 8, MAX_HEADER_BYTES):
                raise LoadError(f"{path}: header length {header_len} is impossible for a "
                                f"{size}-byte file (cap {MAX_HEADER_BYTES})")
            raw = f.read(header_len)
    except OSError as err:
        raise LoadError(f"{path}: cannot read ({err})") from None
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates,
                            parse_constant=_reject_constant)
    except _DuplicateKey as err:
        raise LoadError(f"{path}: duplicate key {err.args[0]!r} in the header") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise LoadError(f"{path}: header is not valid UTF-8 JSON ({err})") from None
    if not isinstance(header, dict):
        raise LoadError(f"{path}: header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", None) or {}  # MLX writes null when there is none
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise LoadError(f"{path}: __metadata__ must map strings to strings")
    data_len = size - 8 - header_len
    ranges = []
    for key, info in header.items():
        where = f"{path}: tensor {key!r}"
        if not key:
            raise LoadError(f"{where}: empty tensor name")
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise LoadError(f"{where}: entry must have exactly dtype, shape, data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in SAFETENSORS_DTYPES:
            raise LoadError(f"{where}: unknown or unsupported dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_int(d) and 0 <= d <= MAX_DIM
                                                  for d in shape):
            raise LoadError(f"{where}: shape {shape!r} is not a list of ints in [0, 2^31)")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_int(o) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_len):
            raise LoadError(f"{where}: data_offsets {offsets!r} outside the {data_len}-byte "
                            "data region")
        nbytes = math.prod(shape) * SAFETENSORS_DTYPES[dtype]
        if offsets[1] - offsets[0] != nbytes:
            raise LoadError(f"{where}: shape {shape} x {dtype} needs {nbytes} bytes but "
                            f"data_offsets {offsets} span {offsets[1] - offsets[0]}")
        ranges.append((offsets[0], offsets[1], key))
    end = 0
    for begin, stop, key in sorted(ranges):
        if begin != end:
            what = "overlaps the previous tensor" if begin < end else f"leaves a gap at {end}"
            raise LoadError(f"{path}: tensor {key!r} at bytes {begin}..{stop} {what}")
        end = stop
    if end != data_len:
        raise LoadError(f"{path}: tensors cover {end} bytes but the data region has {data_len}")
    return header, metadata, 8 + header_len


def read_safetensors(path: str | Path, return_metadata: bool = False):
    """{key: mx.array} (and the `__metadata__` dict when return_metadata) from a safetensors
    file, validated by `parse_safetensors_header` before `mx.load` sees it; arrays are
    evaluated here so a read error surfaces now, as a LoadError."""
    path = Path(path)
    header, _, _ = parse_safetensors_header(path)
    try:
        arrays, metadata = mx.load(str(path), format="safetensors", return_metadata=True)
        mx.eval(list(arrays.values()))
    except Exception as err:  # MLX raises RuntimeError/ValueError with its own text
        raise LoadError(f"{path}: MLX could not read it ({err})") from None
    if set(arrays) != set(header):
        raise LoadError(f"{path}: MLX read keys {sorted(set(arrays) ^ set(header))} "
                        "differently from the header")
    for key, info in header.items():
        got = (list(arrays[key].shape), arrays[key].dtype)
        if got != (info["shape"], MX_DTYPES[info["dtype"]]):
            raise LoadError(f"{path}: tensor {key!r}: MLX read {got}, header says "
                            f"{info['shape']} {info['dtype']}")
    return (arrays, metadata) if return_metadata else arrays


# ----------------------------------------------------------------------------------- npz

DEFLATE_MAX_RATIO = 1100  # deflate cannot expand more than ~1032x; anything above is a lie


def read_npz(path: str | Path) -> dict[str, np.ndarray]:
    """{name: np.ndarray} from an .npz, with `allow_pickle=False`; object arrays are refused.

    Each member's .npy header is read first and its shape * itemsize checked against the
    member's declared size (which itself must be plausible for its compression), so a forged
    header cannot make NumPy allocate more than the archive can hold.
    """
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            names = [i.filename for i in infos]
            if len(set(names)) != len(names):
                raise LoadError(f"{path}: duplicate members in the archive")
            for info in infos:
                _check_npy_member(path, zf, info)
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except LoadError:
        raise
    except Exception as err:  # zipfile.BadZipFile, ValueError (pickle refused), OSError, ...
        raise LoadError(f"{path}: not a readable pickle-free npz ({type(err).__name__}: "
                        f"{err})") from None


def _check_npy_member(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
    where = f"{path}: member {info.filename!r}"
    if not info.filename.endswith(".npy"):
        raise LoadError(f"{where}: not an .npy member")
    if info.compress_type == zipfile.ZIP_STORED:
        plausible = info.file_size <= info.compress_size
    elif info.compress_type == zipfile.ZIP_DEFLATED:
        plausible = info.file_size <= DEFLATE_MAX_RATIO * info.compress_size + 1024
    else:
        raise LoadError(f"{where}: compression method {info.compress_type} refused")
    archive_size = path.stat().st_size
    if not plausible or info.compress_size > archive_size \
            or info.file_size > archive_size * DEFLATE_MAX_RATIO:
        raise LoadError(f"{where}: declared size {info.file_size} is impossible for "
                        f"{info.compress_size} compressed bytes")
    with zf.open(info) as fp:
        try:
            version = np.lib.format.read_magic(fp)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
            else:
                raise LoadError(f"{where}: .npy format version {version} unsupported")
        except LoadError:
            raise
        except Exception as err:
            raise LoadError(f"{where}: bad .npy header ({err})") from None
        header_len = fp.tell()
    if dtype.hasobject:
        raise LoadError(f"{where}: object arrays (pickles) are refused")
    if any(d < 0 for d in shape) or header_len + math.prod(shape) * dtype.itemsize \
            != info.file_size:
        raise LoadError(f"{where}: shape {shape} x {dtype} does not match its "
                        f"{info.file_size - header_len} data bytes")


# --------------------------------------------------------------------------- torch / pickle

CONVERT_HINT = (
    "convert it once where PyTorch is installed: python -c \"import torch, safetensors.torch "
    "as st; sd = torch.load('{path}', map_location='cpu', weights_only=True); "
    "st.save_file({{k: v.contiguous() for k, v in sd.items()}}, '{out}')\""
)


def read_torch_bin(path: str | Path) -> dict[str, mx.array]:
    """{dotted key: mx.array} from a PyTorch checkpoint via `torch.load(weights_only=True)`
    (tensors and plain containers only; any other pickled object is refused). Without torch,
    a LoadError gives the one-line command that converts the file to safetensors."""
    path = Path(path)
    try:
        import torch
    except ImportError:
        hint = CONVERT_HINT.format(path=path, out=path.with_suffix(".safetensors"))
        raise LoadError(f"{path}: reading PyTorch checkpoints needs torch; {hint}") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError for any non-weights global, or a bad file
        raise LoadError(f"{path}: refused: torch.load(weights_only=True) failed, so it is not "
                        f"a plain weights file (arbitrary pickles are never loaded): {err}"
                        ) from None
    out: dict[str, mx.array] = {}
    _torch_leaves(path, state, "", out, torch)
    return out


def _torch_leaves(path: Path, node: Any, prefix: str, out: dict, torch: Any) -> None:
    if isinstance(node, torch.Tensor):
        if not prefix:
            raise LoadError(f"{path}: holds a bare tensor, not a state dict")
        tensor = node.detach().cpu().contiguous()
        if tensor.dtype == torch.bfloat16:  # NumPy has no bfloat16: widen, exact both ways
            out[prefix] = mx.array(tensor.float().numpy()).astype(mx.bfloat16)
        else:
            out[prefix] = mx.array(tensor.numpy())
    elif isinstance(node, dict):
        for key, value in node.items():
            _torch_leaves(path, value, f"{prefix}.{key}" if prefix else str(key), out, torch)
    else:
        raise LoadError(f"{path}: key {prefix!r} holds a {type(node).__name__}, not a tensor")


PICKLE_SUFFIXES = {".pkl", ".pickle", ".joblib", ".dill"}


def read_weights(path: str | Path) -> dict[str, Any]:
    """Dispatch on the suffix: .safetensors, .gguf (arrays only), .npz, .bin/.pt/.pth;
    plain pickles and anything else are refused."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        return read_safetensors(path)
    if suffix == ".gguf":
        return read_gguf(path)[0]
    if suffix == ".npz":
        return read_npz(path)
    if suffix in {".bin", ".pt", ".pth"}:
        return read_torch_bin(path)
    if suffix in PICKLE_SUFFIXES:
        raise LoadError(f"{path}: pickle files are refused (unpickling runs arbitrary code); "
                        "save the weights as safetensors or npz instead")
    raise LoadError(f"{path}: unknown weights format {suffix!r} (want .safetensors, .gguf, "
                    ".npz, .bin/.pt/.pth)")
