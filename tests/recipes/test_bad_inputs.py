"""Issue 38: every input checked before the work starts. Each case here was a traceback, a hang,
a silent wrong result or litter; each now gets one line `<prog>: error: <what> (<where>); <fix>`
and its exit code (2 usage / config, 1 runtime), or the documented behaviour."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from lock_holder import holding

from mlxio import inputs
from mlxio.errors import ConfigError, DataError, DiskError, MlxioError, RunError, cli_main
from mlxio.rl import memory_bounds
from mlxio.run import checkpoint, context
from mlxio.search import searcher
from recipes import code_search, rlaif_qwen, xtr_lora

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^(xtr_lora|rlaif_qwen|python -m recipes\.\S+): error: .+ \(.*\); .+$")
PROGS = {"xtr_lora": xtr_lora.main, "rlaif_qwen": rlaif_qwen.main, "python -m recipes.code_search": code_search.main}


def run_cli(prog: str, argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr's last line) of an entry point run in-process under the error contract."""
    with pytest.raises(SystemExit) as exit_:
        cli_main(prog, PROGS[prog], argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    return exit_.value.code, err[-1] if err else ""


def assert_line(prog: str, argv: list[str], capsys, code: int, *words: str) -> str:
    got, last = run_cli(prog, argv, capsys)
    assert got == code, last
    assert LINE.match(last), last
    for word in words:
        assert word in last, (word, last)
    return last


# ---------------------------------------------------------------- config-time checks (exit 2)

@pytest.mark.parametrize("url, why", [("http://127.0.0.1:99999", "Port out of range"), ("http://[::1", "IPv6"),
                                      ("http://", "names no host"), ("http://h:abc/v1", "Port could not be cast"),
                                      ("ftp://h", "http:// or https://"), ("http://a b", "whitespace")])
def test_teacher_url_checked_before_the_model_loads(url, why, tmp_path, capsys):
    assert_line("rlaif_qwen", ["--preset", "smoke", "--out_dir", str(tmp_path / "r"), "--teacher.url", url], capsys, 2,
                "teacher.url", why)
    assert not (tmp_path / "r").exists()  # refused before the run folder exists


@pytest.mark.parametrize("argv, words", [
    (["--lora.targets", ""], ("lora.targets", "empty")),
    (["--model", "tiny:nope"], ("tiny:nope", "tiny:llama")),
    (["--model", ""], ("model", "must not be empty")),
    (["--teacher.local", ""], ("teacher.local", "must not be empty")),
    (["--optim.warmup_steps", "1000000"], ("optim.warmup_steps", "never reaches")),
    (["--out_dir", "/tmp/" + "a/" * 1500], ("out_dir", "folders deep")),
    (["--out_dir", "/tmp/" + ("b" * 200 + "/") * 30], ("out_dir", "bytes long")),
    (["--out_dir", "/tmp/" + "c" * 300], ("out_dir", "component")),
])
def test_rlaif_settings_refused_up_front(argv, words, capsys):
    assert_line("rlaif_qwen", ["--preset", "smoke", *argv], capsys, 2, *words)


@pytest.mark.parametrize("argv, words", [
    (["--train.micro_batch", "1"], ("train.micro_batch", "in-batch negative")),
    (["--model", ""], ("model", "must not be empty")),
    (["--data.source", ""], ("data.source", "must not be empty")),
    (["--optim.warmup_steps", "1000000"], ("optim.warmup_steps", "never reaches")),
    (["--cache_dir", "/tmp/" + "a/" * 1500], ("cache_dir", "folders deep")),
])
def test_retriever_settings_refused_up_front(argv, words, capsys):
    assert_line("xtr_lora", ["--preset", "smoke", *argv], capsys, 2, *words)


def test_a_long_message_keeps_its_fix():
    from mlxio.errors import one_line

    text = one_line("cannot write (" + "/x" * 5000 + "); pick a shorter path")
    assert len(text) <= 2000 and text.endswith("); pick a shorter path")


# ---------------------------------------------------------------- memory bounds

def test_settings_that_cannot_fit_are_refused_naming_the_option():
    smol = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "vocab_size": 49152}
    cfg = rlaif_qwen.PRESETS["quick"]
    import attrs

    def check(cfg):
        memory_bounds.check_rlaif(smol, prompts_per_step=cfg.prompts_per_step, group_size=cfg.group_size,
                           max_new_tokens=cfg.max_new_tokens, accum=cfg.train.accum, ev=cfg.eval, available=16 << 30)

    check(cfg)  # the default fits in 16 GiB
    with pytest.raises(ConfigError, match=r"group_size: 4096 cannot fit.*this machine has 16.0 GiB") as err:
        check(attrs.evolve(cfg, group_size=4096))
    assert "lower --group_size" in err.value.contract_line()
    big_eval = attrs.evolve(cfg, eval=attrs.evolve(cfg.eval, batch=4096, samples=4096))
    with pytest.raises(ConfigError, match=r"eval.batch: 4096 cannot fit"):
        check(big_eval)


def test_retriever_batch_that_cannot_fit_is_refused(capsys):
    assert_line("xtr_lora", ["--preset", "smoke", "--train.micro_batch", "65536", "--train.accum", "1",
                             "--train.eval_batch", "16"], capsys, 2, "train.micro_batch", "cannot fit")


def test_code_search_lengths_checked_before_embedding(tmp_path, capsys):
    from mlxio.weights.encoders import default_encoder_path

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("def f(x):\n    y = x + 1\n    return y\n")
    common = ["index", str(src), "--model", str(default_encoder_path()), "--index", str(tmp_path / "ix")]
    assert_line("python -m recipes.code_search", [*common, "--max-doc-len", "100000"], capsys, 2,
                "--max-doc-len", "max_position_embeddings")
    assert_line("python -m recipes.code_search", [*common, "--max-doc-len", "512", "--batch-size", "1000000"],
                capsys, 2, "max-doc-len", "cannot fit")
    assert not (tmp_path / "ix").exists()


# ---------------------------------------------------------------- the worker

def test_worker_cli_is_strict(tmp_path):
    for argv, words in ((["--log-level", "FOO"], "invalid choice"), (["--max-line-bytes", "5"], "1024"),
                        (["--log"], "unrecognized")):
        proc = subprocess.run([sys.executable, "-m", "recipes.rlaif_worker", *argv], input=b"", capture_output=True,
                              timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        lines = proc.stderr.decode().strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and LINE.match(lines[0]) and words in lines[0], lines


def test_worker_generate_is_bounded(tmp_path):
    from mlxio import rpc
    from mlxio.run.config import to_dict
    from recipes.rlaif_config import PRESETS
    from recipes.rlaif_worker import make_worker

    worker = make_worker()
    server = worker.server()

    def call(method, **params):
        line = rpc.encode({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        return json.loads(server.handle_line(line.rstrip(b"\n")))

    cfg = {**to_dict(PRESETS["smoke"]), "out_dir": str(tmp_path)}
    assert "result" in call("initialize", preset="smoke", config=cfg)
    for params, field in (({"prompts": ["a"], "n": 100000}, "params.n"),
                          ({"prompts": ["a"] * 3, "n": 2048}, "params.n"),
                          ({"prompts": ["a"], "n": 1, "max_tokens": 100000}, "params.max_tokens")):
        answer = call("generate", **params)
        assert answer["error"]["code"] == rpc.INVALID_PARAMS and field in answer["error"]["message"], answer
    assert "result" in call("generate", prompts=["a"], n=2, max_tokens=2)  # and it still answers
    long_row = {"tokens": [[1] * 3000] * 2, "completion_mask": [[1] * 3000] * 2, "advantages": [1.0, -1.0]}
    answer = call("train_step", **long_row)
    assert answer["error"]["code"] == rpc.INVALID_PARAMS and "max_position_embeddings" in answer["error"]["message"]
    answer = call("eval_logprobs", tokens=[[1, 2]] * 5000)
    assert answer["error"]["code"] == rpc.INVALID_PARAMS and "split it" in answer["error"]["message"]


def test_code_search_paths_checked_before_anything_is_created(tmp_path, capsys):
    deep = str(tmp_path) + "/a" * 1500
    assert_line("python -m recipes.code_search", ["index", str(tmp_path), "--model", "x", "--index", deep], capsys, 2,
                "index", "folders deep", "set --index")
    assert_line("python -m recipes.code_search", ["search", "--index", str(tmp_path), "--queries", deep], capsys, 2,
                "queries", "set --queries")
    assert not (tmp_path / "a").exists()


# ---------------------------------------------------------------- inputs: regular files, byte caps

@pytest.fixture
def odd_files(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    return {"fifo": fifo, "device": Path("/dev/zero"), "link to a device": link, "directory": tmp_path}


@pytest.mark.parametrize("kind", ["fifo", "device", "link to a device", "directory"])
def test_special_files_are_refused_naming_the_path(kind, odd_files, tmp_path, capsys):
    path = odd_files[kind]
    started = time.perf_counter()
    assert_line("xtr_lora", ["--preset", "smoke", "--config", str(path)], capsys, 2, str(path), "not a regular file")
    assert_line("rlaif_qwen", ["--preset", "smoke", "--out_dir", str(tmp_path / f"r-{kind}"),
                               "--data.problems", str(path)], capsys, 1, str(path), "not a regular file")
    index = tmp_path / "ix"
    (index / "gen-000001").mkdir(parents=True, exist_ok=True)
    (index / "CURRENT").write_text("gen-000001\n")
    assert_line("python -m recipes.code_search", ["search", "--index", str(index), "--queries", str(path)], capsys, 1,
                str(path), "not a regular file")
    assert time.perf_counter() - started < 30  # nothing blocked on the FIFO nor read the device


def test_byte_caps(tmp_path, monkeypatch, capsys):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(11_000_000)  # sparse: larger than the 10 MB config cap
    assert_line("xtr_lora", ["--preset", "smoke", "--config", str(big)], capsys, 2, "11000000 bytes")
    bomb = tmp_path / "bomb.jsonl.gz"
    bomb.write_bytes(gzip.compress(b"\n" * (64 << 20)))
    monkeypatch.setattr("mlxio.rl.problems.MAX_PROBLEMS_BYTES", 16 << 20)
    assert len(bomb.read_bytes()) < 1 << 20
    assert_line("rlaif_qwen", ["--preset", "smoke", "--out_dir", str(tmp_path / "r"), "--data.problems", str(bomb)],
                capsys, 1, "gzip bomb", str(bomb))


def test_gunzip_bounded():
    data = gzip.compress(b"ab") + gzip.compress(b"cd")
    assert inputs.gunzip_bounded(data, max_bytes=4, where="x") == b"abcd"
    with pytest.raises(DataError, match="more than 3 bytes"):
        inputs.gunzip_bounded(data, max_bytes=3, where="x")
    with pytest.raises(DataError, match="truncated"):
        inputs.gunzip_bounded(gzip.compress(bytes(range(256)) * 4)[:40], max_bytes=10_000, where="x")


def _index_source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.py").write_text("def add(a, b):\n    total = a + b\n    return total\n")
    (src / "latin1.py").write_bytes(b"def f(x):\n    s = '\xe9t\xe9'\n    return s + x\n")
    os.mkfifo(src / "pipe.py")
    (src / "zero.py").symlink_to("/dev/zero")
    (src / "gone.py").symlink_to(src / "nowhere")
    return src


class FakeEmbed:
    """Deterministic unit vectors per token (as tests/test_search_index.py's)."""

    def __init__(self, dim: int = 16):
        self.dim = dim

    def __call__(self, texts, progress=None):
        out = []
        for t in texts:
            words = t.split()[:8] or ["x"]
            rng = [np.random.default_rng(abs(hash(w)) % (2**32)) for w in words]
            v = np.stack([r.standard_normal(self.dim) for r in rng]).astype(np.float32)
            out.append((v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float16))
        return out


META = {"model": "fake", "max_doc_len": 64, "max_query_len": 16, "dim": 16}


def test_index_skips_and_counts_odd_source_files(tmp_path):
    from mlxio.search import build

    started = time.perf_counter()
    report = build.update(_index_source(tmp_path), tmp_path / "ix", FakeEmbed(), META)
    assert time.perf_counter() - started < 60
    assert report.documents == 1
    assert report.skipped == {"not UTF-8 or unreadable": 1, "a FIFO (named pipe), not a regular file": 1,
                              "a character device, not a regular file": 1, "a dangling symlink, not a regular file": 1}


def test_mining_skips_and_counts_odd_source_files(tmp_path):
    from mlxio.data import pairs

    corpus = pairs.mine_corpus([_index_source(tmp_path)])
    assert corpus.report.not_regular == 3 and corpus.report.undecodable == 1


# ---------------------------------------------------------------- model folders

@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from mlxio.weights import llm
    from mlxio.weights.encoders import default_encoder_path

    root = tmp_path_factory.mktemp("models")
    enc = default_encoder_path()
    tiny = llm.tiny_policy("llama")
    llm.save_model_dir(tiny.model, tiny.tokenizer._tokenizer, tiny.config, root / "tiny")
    # another model's tokenizer: 49,152 ids (SmolLM2's byte-level BPE)
    from tokenizers import Tokenizer, models, pre_tokenizers

    other = Tokenizer(models.WordLevel({f"w{i}": i for i in range(40000)}, unk_token="w0"))
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    dirs = {}
    for name, tok in (("enc_empty", ""), ("enc_other", other.to_str())):
        d = root / name
        d.mkdir()
        for f in ("config.json", "model.safetensors"):
            (d / f).symlink_to(enc / f)
        (d / "tokenizer.json").write_text(tok)
        dirs[name] = d
    import shutil

    for name, tok in (("llm_empty", ""), ("llm_other", other.to_str())):
        shutil.copytree(root / "tiny", root / name)
        (root / name / "tokenizer.json").write_text(tok)
        dirs[name] = root / name
    return dirs


@pytest.mark.parametrize("name, words", [("enc_empty", "tokenizer.json is empty"),
                                         ("enc_other", "ids go up to 39999 but the embedding table has 30522")])
def test_encoder_folder_checked_at_load(name, words, model_dirs, tmp_path, capsys):
    assert_line("xtr_lora", ["--preset", "smoke", "--model", str(model_dirs[name]), "--out_dir", str(tmp_path / "x"),
                             "--cache_dir", str(tmp_path / "c")], capsys, 1, words)


@pytest.mark.parametrize("name, words", [("llm_empty", "tokenizer.json is empty"),
                                         ("llm_other", "but the embedding table has 259 rows")])
def test_policy_folder_checked_at_load(name, words, model_dirs, tmp_path, capsys):
    assert_line("rlaif_qwen", ["--preset", "smoke", "--model", str(model_dirs[name]), "--out_dir",
                               str(tmp_path / "r")], capsys, 1, words)


# ---------------------------------------------------------------- runs: non-finite norms, out_dir

def test_an_overflowing_gradient_norm_skips_the_step():
    from mlxcore.train import optim

    opt = optim.make_optimizer(optim.OptimConfig(lr=0.1, warmup_steps=0, total_steps=10))
    params = {"w": mx.ones((4,))}
    transform = optim.skip_if_non_finite(optim.chain(optim.clip(1.0), optim.apply_optimizer(opt)))
    state = transform.init(params)
    grads = {"w": mx.full((4,), 1e30)}  # every element finite, their squared sum is not (float32)
    new, state, info = transform.update(grads, state, params, loss=mx.array(1.0))
    assert int(info["skipped"]) == 1 and int(state["skips"]) == 1
    np.testing.assert_array_equal(np.array(new["w"]), np.ones(4))


def test_one_out_dir_one_run(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with holding(out, seconds=60):
        with pytest.raises(RunError, match="another run is writing this folder") as err:
            context.claim_out_dir(out, resume=True)
        assert "pick another --out_dir" in err.value.contract_line()
    context.claim_out_dir(out, resume=True)  # free once the other run is gone

    @context.releases_out_dirs
    def a_recipe(folder):
        context.claim_out_dir(folder, resume=False)
        assert os.path.realpath(folder) in context._HELD

    (tmp_path / "second").mkdir()
    a_recipe(tmp_path / "second")  # a recipe gives its lock back when it returns (ranks it launches can take it)
    assert os.path.realpath(tmp_path / "second") not in context._HELD


def test_a_finished_runs_folder_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "done"
    (out / "checkpoints" / "step-00000004").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 4, "loss": 1.0}\n')
    (out / "config.json").write_text("{}")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    last = assert_line("rlaif_qwen", ["--preset", "smoke", "--out_dir", str(out)], capsys, 2,
                       "checkpoints up to step 4", "--resume", "--overwrite")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".lock"} == before, last
    context.claim_out_dir(out, resume=False, overwrite=True)
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists()


def test_wandb_that_cannot_start_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from mlxio.run.reporting import WandbWriter

    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a key
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "10")
    with pytest.raises(RunError) as err:
        WandbWriter(tmp_path, "p", "n", {})
    line = err.value.contract_line()
    assert "WANDB_MODE=online" in line and "WANDB_MODE=offline" in line and "\n" not in line


# ---------------------------------------------------------------- disk full during a checkpoint

def _trees():
    return {"trainable": {"w": mx.ones((512, 512))}, "opt_state": {"m": mx.zeros((512, 512))}}  # 2 MiB


def test_disk_full_during_a_checkpoint_is_a_disk_error(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, 1, _trees(), {"x": 1})
    real = mx.save_safetensors

    def full(path, arrays, metadata=None):
        real(path, arrays, metadata=metadata)
        with open(path, "r+b") as f:
            f.truncate(100)
        raise OSError(28, "No space left on device", path)
    monkeypatch.setattr(mx, "save_safetensors", full)
    with pytest.raises(DiskError) as err:
        checkpoint.save(tmp_path, 2, _trees(), {"x": 1})
    line = err.value.contract_line()
    assert "checkpoint of step 2" in line and "previous checkpoint is intact" in line and "free disk space" in line
    assert checkpoint.load_latest(tmp_path)[2]["step"] == 1
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["LATEST", "step-00000001"] or sorted(
        p.name for p in (tmp_path / "checkpoints").iterdir()) == ["LATEST", "step-00000001"]


def test_disk_full_on_a_real_tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        checkpoint.save(disk, 1, {"trainable": {"w": mx.ones((64, 64))}}, {})
        with pytest.raises(DiskError, match="previous checkpoint is intact"):
            checkpoint.save(disk, 2, _trees(), {})
        assert checkpoint.load_latest(disk)[2]["step"] == 1
        assert sorted(p.name for p in (disk / "checkpoints").iterdir()) == ["LATEST", "step-00000001"]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


# ---------------------------------------------------------------- litter

def test_a_killed_exports_temp_folder_is_swept(tmp_path):
    from mlxio.atomic import atomic_dir, write_json_atomic

    dead = 2**22 + 12345  # above the default pid_max: no such process
    litter = [tmp_path / f".colbert.tmp-{dead}-deadbeef", tmp_path / f".eval.json.tmp-{dead}-0badf00d"]
    litter[0].mkdir()
    (litter[0] / "model.safetensors").write_bytes(b"half")
    litter[1].write_text("{")
    mine = tmp_path / f".merged.tmp-{os.getpid()}-12345678"  # a live writer's (this process)
    mine.mkdir()
    with atomic_dir(tmp_path / "colbert") as tmp:
        (tmp / "x").write_text("1")
    assert not litter[0].exists() and mine.exists() and (tmp_path / "colbert" / "x").exists()
    write_json_atomic(tmp_path / "eval.json", {"a": 1})
    assert not litter[1].exists()


# ---------------------------------------------------------------- the search index

def _small_index(tmp_path: Path, meta: dict = META) -> Path:
    from mlxio.search import build

    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    for i in range(6):
        (src / f"mod{i}.py").write_text(f"def parse_date_{i}(text):\n    day, month = text.split('/')\n"
                                        f"    return int(day) + {i}\n\n\ndef other_{i}(x):\n    y = x * {i}\n    return y\n")
    build.update(src, tmp_path / "ix", FakeEmbed(), meta)
    return tmp_path / "ix"


@pytest.mark.parametrize("field, value", [("dim", "16"), ("centroids", None), ("segments", "x"),
                                          ("search", {"nprobe": "8"}), ("fusion", {"alpha": "0.5"}),
                                          ("max_query_len", 1.5)])
def test_a_manifest_of_wrong_types_is_one_line(field, value, tmp_path, capsys):
    from mlxio.search import store

    idx = _small_index(tmp_path)
    gen = store.current(idx)
    manifest = json.loads((gen / "manifest.json").read_text())
    manifest[field] = value
    (gen / "manifest.json").write_text(json.dumps(manifest))
    assert_line("python -m recipes.code_search", ["search", "--index", str(idx), "--mode", "bm25", "parse"], capsys,
                1, "manifest.json", field, "rebuild")


def test_bm25_returns_only_matching_documents(tmp_path):
    from mlxio.search.index import Index

    hits = Index(_small_index(tmp_path)).search("parse", None, "bm25", top_k=50)
    assert len(hits) == 6 and all(score > 0 for _, score in hits)
    assert Index(tmp_path / "ix").search("zebra", None, "bm25", top_k=5) == []


def test_a_changed_model_is_refused_by_search_and_rebuilt_by_update(tmp_path):
    from mlxio.search import build
    from mlxio.search.index import Index
    from mlxio.weights.encoders import model_digest

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"v": 1}')
    (model / "model.safetensors").write_bytes(b"old weights")
    digest = model_digest(model)
    idx = _small_index(tmp_path, {**META, "model": str(model), "model_digest": digest})

    class Encoder:
        path = model

    searcher.check_model(Index(idx), Encoder())  # same weights: fine
    (model / "model.safetensors").write_bytes(b"new weights")
    with pytest.raises(MlxioError, match="changed since this index was built") as err:
        searcher.check_model(Index(idx), Encoder())
    assert str(idx) in err.value.contract_line()
    report = build.update(tmp_path / "src", idx, FakeEmbed(), {**META, "model": str(model),
                                                              "model_digest": model_digest(model)})
    assert report.rebuilt and "model_digest" in report.rebuilt_because and report.embedded == 12


def test_readers_during_updates_never_fail(tmp_path):
    from mlxio.search import build
    from mlxio.search.index import Index

    idx = _small_index(tmp_path)
    src = tmp_path / "src"
    failures, loads, stop = [], [0], threading.Event()

    def read():
        while not stop.is_set():
            try:
                index = Index(idx)
                index.search("parse", None, "bm25", top_k=3)
                loads[0] += 1
            except Exception as err:  # noqa: BLE001 - what the test counts
                failures.append(repr(err))

    readers = [threading.Thread(target=read) for _ in range(2)]
    for r in readers:
        r.start()
    try:
        for i in range(12):
            (src / f"mod{i % 6}.py").write_text(f"def changed_{i}(x):\n    y = x + {i}\n    return y\n")
            build.update(src, idx, FakeEmbed(), META)
    finally:
        stop.set()
        for r in readers:
            r.join()
    assert loads[0] > 0 and failures == []


def test_two_writers_serialise(tmp_path):
    from mlxio.search import build

    idx = _small_index(tmp_path)
    src = tmp_path / "src"
    (src / "new_a.py").write_text("def a_new(x):\n    y = x + 1\n    return y\n")
    (src / "new_b.py").write_text("def b_new(x):\n    y = x + 2\n    return y\n")
    reports, errors = [], []

    def write():
        try:
            reports.append(build.update(src, idx, FakeEmbed(), META))
        except Exception as err:  # noqa: BLE001
            errors.append(repr(err))

    threads = [threading.Thread(target=write) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(reports) == 2
    assert not any(r.rebuilt for r in reports)  # incremental, both: never a full rebuild
    assert sorted(r.embedded for r in reports) == [0, 2]
