"""Checkpoints: save -> load identity, corruption detection and fallback, refusal of foreign
checkpoints, crash safety under killed writers, RNG reproducibility, pruning."""

import contextlib
import json
import logging
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlxio.errors import CheckpointError
from mlxio.run import checkpoint as ck

REPO = Path(__file__).resolve().parents[3]
DTYPES = {  # mx dtype -> numpy dtype the values are drawn in (bf16 drawn as float32, cast)
    mx.float32: np.float32, mx.bfloat16: np.float32, mx.float16: np.float16,
    mx.uint64: np.uint64, mx.int32: np.int32, mx.uint8: np.uint8, mx.int64: np.int64,
}


@st.composite
def arrays(draw):
    dtype = draw(st.sampled_from(list(DTYPES)))
    np_dtype = np.dtype(DTYPES[dtype])
    elements = (st.floats(-1e4, 1e4, width=np_dtype.itemsize * 8)
                if np_dtype.kind == "f" else None)
    value = draw(hnp.arrays(np_dtype, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
                            elements=elements))
    return mx.array(value).astype(dtype)


names = st.text("abcdefgh_", min_size=1, max_size=6)
trees = st.recursive(
    arrays(),
    lambda inner: st.one_of(st.dictionaries(names, inner, min_size=1, max_size=3),
                            st.lists(st.dictionaries(names, inner, min_size=1, max_size=2),
                                     min_size=1, max_size=3)),
    max_leaves=6,
).filter(lambda t: isinstance(t, dict))


def assert_same_tree(a, b):
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_tree(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_tree(x, y)
    else:
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.dtype == mx.bfloat16:  # NumPy has no bfloat16: compare its bit pattern
            a, b = a.view(mx.uint16), b.view(mx.uint16)
        # bytes, not values: exact for every dtype (uint64 above 2^63, -0.0, NaN payloads)
        assert np.array(a).tobytes() == np.array(b).tobytes()


def small_state(step: int) -> dict:
    """A params + optimizer-state pair whose values all encode `step`."""
    params = {"layers": [{"w": mx.full((4, 8), step, mx.bfloat16)},
                         {"w": mx.full((4, 8), step, mx.float32)}],
              "ids": mx.arange(step, step + 3, dtype=mx.int32)}
    opt = {"step": mx.array(step, mx.uint64), "learning_rate": mx.array(1e-3, mx.float32),
           "layers": [{"w": {"m": mx.full((4, 8), step, mx.float32)}}]}
    return {"params": params, "opt_state": opt}


@given(params=trees, opt=trees, step=st.integers(0, 10**9))
def test_save_load_identity(params, opt, step):
    with tempfile.TemporaryDirectory() as run:
        path = ck.save(run, step, {"params": params, "opt_state": opt},
                       {"config_hash": "h", "data": {"pos": 7}})
        assert path.name == f"step-{step:08d}"
        trees_back, meta = ck.load(path)
        assert_same_tree(trees_back["params"], params)
        assert_same_tree(trees_back["opt_state"], opt)
        assert meta == {"config_hash": "h", "data": {"pos": 7}, "step": step}
        found = ck.load_latest(run, expect={"config_hash": "h"})
        assert found[0] == path and found[2] == meta


def test_optimizer_state_round_trip(tmp_path):
    from mlxcore.train.optim import OptimConfig, make_optimizer
    params = {"layers": [{"w": mx.ones((3, 2))}]}
    opt = make_optimizer(OptimConfig())
    state = opt.init(params)
    params, state = opt.update({"layers": [{"w": mx.ones((3, 2))}]}, state, params)
    trees, _ = ck.load(ck.save(tmp_path, 1, {"params": params, "opt_state": state}, {}))
    assert trees["opt_state"]["step"].dtype == mx.uint64 and trees["opt_state"]["step"].item() == 1
    assert_same_tree(trees["opt_state"], state)


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    for step in (10, 20):
        ck.save(run, step, small_state(step), {"config_hash": "abc", "base_model": "m"})
    return run


@contextlib.contextmanager
def captured_warnings():
    """Records logged by mlxio.run.checkpoint (caplog is function-scoped, so unfit for @given)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("mlxio.run.checkpoint")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


CKPT_FILES = ["params.safetensors", "opt_state.safetensors", "meta.json", "manifest.json"]


@settings(max_examples=24)
@given(fname=st.sampled_from(CKPT_FILES), where=st.floats(0, 1, exclude_max=True),
       bit=st.integers(0, 7))
def test_byte_flip_is_caught_and_skipped(two_checkpoints, fname, where, bit):
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(two_checkpoints, run)
        target = run / "checkpoints" / "step-00000020" / fname
        data = bytearray(target.read_bytes())
        data[int(where * len(data))] ^= 1 << bit
        target.write_bytes(bytes(data))
        with pytest.raises(CheckpointError, match=fname):
            ck.load(target.parent)
        with captured_warnings() as records:
            path, trees, meta = ck.load_latest(run)
        assert path.name == "step-00000010" and meta["step"] == 10
        assert trees["opt_state"]["step"].item() == 10
        assert any(fname in r.getMessage() for r in records)


@pytest.mark.parametrize("damage", ["delete", "truncate", "append"])
def test_missing_or_resized_file_named(two_checkpoints, tmp_path, damage):
    run = tmp_path / "run"
    shutil.copytree(two_checkpoints, run)
    target = run / "checkpoints" / "step-00000020" / "opt_state.safetensors"
    if damage == "delete":
        target.unlink()
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:-1])
    else:
        target.write_bytes(target.read_bytes() + b"\0")
    with pytest.raises(CheckpointError, match="opt_state.safetensors"):
        ck.load(target.parent)
    assert ck.load_latest(run)[0].name == "step-00000010"


def test_all_corrupt_raises_and_empty_is_none(two_checkpoints, tmp_path):
    assert ck.load_latest(tmp_path / "nothing") is None
    run = tmp_path / "run"
    shutil.copytree(two_checkpoints, run)
    for step_dir in (run / "checkpoints").glob("step-*"):
        (step_dir / "meta.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no checkpoint verifies"):
        ck.load_latest(run)


def test_bad_latest_pointer_falls_back_to_newest(two_checkpoints, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(two_checkpoints, run)
    (run / "checkpoints" / "LATEST").write_text("../../etc\n")
    assert ck.load_latest(run)[0].name == "step-00000020"


@pytest.mark.parametrize("field,value", [("config_hash", "other"), ("base_model", "qwen"),
                                         ("tokenizer", "t")])
def test_expect_mismatch_refused(two_checkpoints, field, value):
    expect = {"config_hash": "abc", "base_model": "m", field: value}
    with pytest.raises(CheckpointError) as err:
        ck.load_latest(two_checkpoints, expect=expect)
    msg = str(err.value)
    assert field in msg and repr(value) in msg
    assert "<absent>" in msg if field == "tokenizer" else "'abc'" in msg or "'m'" in msg


def test_config_hash_is_canonical():
    a = ck.config_hash({"b": 1, "a": {"y": [1, 2], "x": "s"}})
    assert a == ck.config_hash({"a": {"x": "s", "y": [1, 2]}, "b": 1})
    assert a != ck.config_hash({"b": 2, "a": {"y": [1, 2], "x": "s"}})
    assert len(a) == 64
    with pytest.raises(CheckpointError):
        ck.config_hash({"x": float("nan")})


def test_pruning_keeps_keep_last(tmp_path):
    for step in range(7):
        ck.save(tmp_path, step, small_state(step), {}, keep_last=3)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.glob("step-*")) == [
        "step-00000004", "step-00000005", "step-00000006"]
    ck.save(tmp_path, 7, small_state(7), {}, keep_last=1)
    assert [p.name for p in root.glob("step-*")] == ["step-00000007"]
    assert (root / "LATEST").read_text().strip() == "step-00000007"
    # re-saving a step replaces it
    ck.save(tmp_path, 7, small_state(70), {"again": True}, keep_last=1)
    assert ck.load_latest(tmp_path)[2]["again"] is True


def test_meta_scalars_and_paths_become_json(tmp_path):
    meta = {"loss": np.float32(0.5), "seen": mx.array(7), "data": tmp_path / "d.jsonl"}
    ck.save(tmp_path, 3, {}, meta)
    _, trees, back = ck.load_latest(tmp_path)
    assert trees == {}
    assert back == {"loss": 0.5, "seen": 7, "data": str(tmp_path / "d.jsonl"), "step": 3}


def test_bad_inputs_refused(tmp_path):
    with pytest.raises(CheckpointError, match="not JSON-able"):
        ck.save(tmp_path, 1, {}, {"x": object()})
    with pytest.raises(CheckpointError, match="not an array"):
        ck.save(tmp_path, 1, {"params": {"lr": 0.1}}, {})
    with pytest.raises(CheckpointError, match="all digits"):
        ck.save(tmp_path, 1, {"params": {"0": mx.ones(2)}}, {})
    with pytest.raises(CheckpointError, match="safe file name"):
        ck.save(tmp_path, 1, {"../x": {}}, {})
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_stale_temp_dirs_ignored_and_cleaned(tmp_path):
    ck.save(tmp_path, 1, small_state(1), {})
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = tmp_path / "checkpoints" / f".tmp-step-00000002-{dead.stdout.strip()}-ab12"
    stale.mkdir()
    (stale / "params.safetensors").write_bytes(b"partial")
    assert ck.load_latest(tmp_path)[0].name == "step-00000001"
    ck.save(tmp_path, 2, small_state(2), {})
    assert not stale.exists()


def test_rng_snapshot_restore_reproduces_draws(tmp_path):
    random.seed(1)
    np.random.seed(2)
    mx.random.seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in random's state
    np.random.standard_normal()  # and in NumPy's

    def draws():
        return (random.random(), random.gauss(0, 1), random.randrange(10**6),
                np.random.rand(3).tolist(), np.random.standard_normal(2).tolist(),
                mx.random.uniform(shape=(3,)).tolist(), mx.random.normal(shape=(2,)).tolist(),
                mx.random.randint(0, 1000, (4,)).tolist())

    snap = ck.rng_snapshot()
    ck.save(tmp_path, 5, small_state(5), {"rng": snap})
    first = draws()
    assert draws() != first  # the generators really advanced
    _, _, meta = ck.load_latest(tmp_path)
    assert json.loads(json.dumps(meta["rng"])) == meta["rng"]
    ck.rng_restore(meta["rng"])
    assert draws() == first
    with pytest.raises(CheckpointError, match="malformed"):
        ck.rng_restore({"python": []})


# ---------------------------------------------------------------------- killed writers

WRITER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {repo!r})
    from mlxio.runtime import setup
    setup()
    import mlx.core as mx
    from mlxio.run import checkpoint as ck
    run, start, crash = sys.argv[1], int(sys.argv[2]), sys.argv[3]

    def state(step):
        # ~2.5 MB per checkpoint so a save spends real time in each phase
        return {{"params": {{"w": mx.full((256, 1024), step, mx.float32),
                             "b": mx.full((1024,), step, mx.bfloat16)}},
                 "opt_state": {{"step": mx.array(step, mx.uint64),
                                "m": mx.full((128, 1024), step, mx.float32)}}}}

    def die_after(fn, pred=lambda *a, **k: True, partial=False):
        def wrapped(*args, **kwargs):
            if pred(*args, **kwargs):
                if partial:  # write half of the bytes, then die
                    with open(args[0], "wb") as f:
                        f.write(args[1][: len(args[1]) // 2])
                else:
                    fn(*args, **kwargs)
                os._exit(3)
            return fn(*args, **kwargs)
        return wrapped

    if crash == "loop":
        print("ready", flush=True)
        step = start
        while True:
            ck.save(run, step, state(step), {{"step": step, "config_hash": "c"}}, keep_last=2)
            step += 1
    ck.save(run, start, state(start), {{"config_hash": "c"}})
    if crash == "tree":
        mx.save_safetensors = die_after(mx.save_safetensors)
    elif crash == "manifest":
        ck._write_bytes = die_after(ck._write_bytes, lambda p, d: p.name == "manifest.json", True)
    elif crash == "rename":
        os.rename = die_after(os.rename)
    elif crash == "pointer":
        ck._write_bytes = die_after(ck._write_bytes, lambda p, d: "LATEST" in p.name, True)
    elif crash == "prune":
        ck._prune = die_after(ck._prune, partial=False)
    ck.save(run, start + 1, state(start + 1), {{"config_hash": "c"}})
    sys.exit(4)  # the crash hook did not fire
""")


def writer(run: Path, start: int, crash: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER.format(repo=str(REPO)), str(run), str(start), crash],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def assert_consistent(found, min_step=-1):
    """A load_latest result is complete and verified, and its contents agree with its step."""
    path, trees, meta = found
    step = meta["step"]
    assert path.name == f"step-{step:08d}" and step >= min_step
    ck.verify(path)
    assert trees["opt_state"]["step"].item() == step
    assert float(trees["params"]["w"][0, 0]) == step
    assert float(trees["params"]["b"][-1].astype(mx.float32)) == float(
        mx.array(step, mx.bfloat16).astype(mx.float32))


@pytest.mark.parametrize("crash,expected", [("tree", 1), ("manifest", 1), ("rename", 1),
                                            ("pointer", 1), ("prune", 2)])
def test_writer_dying_at_each_phase(tmp_path, crash, expected):
    proc = writer(tmp_path, 1, crash)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    found = ck.load_latest(tmp_path, expect={"config_hash": "c"})
    assert_consistent(found)
    assert found[2]["step"] == expected
    root = tmp_path / "checkpoints"
    latest = (root / "LATEST").read_text().strip()
    ck.verify(root / latest)  # the pointer always names a complete, verified dir
    ck.save(tmp_path, 9, {"params": {"w": mx.ones(2)}}, {})
    assert not list(root.glob(".tmp-*"))  # the dead writer's leftovers are gone


@pytest.mark.slow
def test_sigkill_at_random_times(tmp_path):
    """SIGKILL a writer that saves in a loop, 12 times at random instants, resuming each time
    from the last good step; every state left behind loads as a complete checkpoint."""
    rng = random.Random(0)
    kills, mid_write, last = 0, 0, -1
    for _ in range(12):
        proc = writer(tmp_path, last + 1, "loop")
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()
        kills += 1
        root = tmp_path / "checkpoints"
        mid_write += bool(list(root.glob(".tmp-*"))) if root.exists() else 0
        found = ck.load_latest(tmp_path, expect={"config_hash": "c"})
        if found is None:  # killed before the first save completed
            assert last == -1 and not (root.exists() and list(root.glob("step-*")))
            continue
        assert_consistent(found, min_step=last)
        assert ck.verify(root / (root / "LATEST").read_text().strip())
        last = found[2]["step"]
    print(f"kills={kills} left_mid_write={mid_write} last_step={last}")
    assert kills >= 10 and last >= 1
