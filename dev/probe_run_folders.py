"""Probe cases for what a run writes and reads (group `files49` of `dev.probe_bad_inputs`):
links planted where a run's file or folder belongs, credentials in a teacher URL, sizes nobody
checked (a model claiming a million layers, a 4.5 MB prompt, `/dev/zero` as a kernel archive)
and inputs that crashed. Each case judges itself: `clear` (one error line, nothing harmed),
`handled` (done as documented), `damaged` (a file outside the run changed or appeared, or a
password written or printed), `silent`, `unclear`, `hang` past the per-case timer, `traceback`.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VICTIM = b"another user's file\n"
SECRET = "hunter2-probe"
NO_EVAL = ["--eval.before", "false", "--eval.after", "false"]


def _plant(slot: Path, kind: str, victims: Path) -> Path:
    """A symlink / hard link / dangling link / FIFO at `slot` (a folder link for 'dir link');
    returns what must stay as it is (a victim file, or a path that must not appear)."""
    victims.mkdir(parents=True, exist_ok=True)
    victim = victims / f"{slot.parent.name}-{slot.name}-{kind.replace(' ', '_')}"
    slot.parent.mkdir(parents=True, exist_ok=True)
    if kind == "dangling link":
        slot.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(slot)
        victim.write_bytes(VICTIM)
    elif kind == "dir link":
        victim.mkdir()
        slot.symlink_to(victim, target_is_directory=True)
    else:
        victim.write_bytes(VICTIM)
        slot.symlink_to(victim) if kind == "symlink" else os.link(victim, slot)
    return victim


def _harmed(victim: Path, kind: str) -> bool:
    if kind == "dangling link":
        return os.path.lexists(victim)
    if kind == "dir link":
        return any(victim.iterdir())
    return victim.read_bytes() != VICTIM


# what a refusal of a planted link or special file says (another refusal would be clear for the wrong reason)
_REFUSAL = ("symbolic link", "hard links", "FIFO", "not a directory")


def _judged(kind: str, detail: str, harmed: bool) -> tuple[str, str]:
    if harmed:
        return "damaged", "the file behind the link changed: " + detail
    if kind == "clear" and not any(word in detail for word in _REFUSAL):
        return "unclear", "refused for another reason: " + detail
    return kind, detail


def _leaks(folder: Path, *texts: str) -> list[str]:
    """Files under `folder` and texts that hold SECRET."""
    found = [str(p) for p in folder.rglob("*") if p.is_file() and not p.is_symlink()
             and SECRET.encode() in p.read_bytes()] if folder.exists() else []
    return found + [f"text {i}" for i, t in enumerate(texts) if SECRET in t]


def _process(argv: list[str], timeout: float, env: dict | None = None) -> tuple[str, str]:
    """A real `python -m ...` run judged by the error contract (one stderr line, exit 1 or 2)."""
    try:
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    except subprocess.TimeoutExpired:
        return "hang", "no answer within the timeout"
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    if "Traceback (most recent call last)" in proc.stderr:
        return "traceback", proc.stderr[-400:]
    if proc.returncode == 0:
        return "silent", (lines or [""])[-1]
    ok = proc.returncode in (1, 2) and len(lines) == 1 and (": error: " in lines[0] or lines[0].startswith("error: "))
    return ("clear" if ok else "unclear"), (lines or [""])[-1]


def _archive(path: Path, members: list[tuple[str, bytes]], manifest: bytes | None = b'{"mlx": null}') -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in ([("kernel_cache.json", manifest)] if manifest is not None else []) + members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _huge_member_archive(path: Path) -> Path:
    """A .tar.gz whose one kernel's header claims 5 GiB (the data is not there)."""
    info = tarfile.TarInfo("ptx/big.ptx")
    info.size = 5 << 30
    manifest = tarfile.TarInfo("kernel_cache.json")
    manifest.size = 2
    body = manifest.tobuf() + b"{}".ljust(512, b"\0") + info.tobuf() + b"\0" * 4096
    path.write_bytes(gzip.compress(body))
    return path


def folder_records(record: Callable, work: Path, cli: Callable, timeout: float) -> None:
    """Record every case of the group through `record(cls, what, fn)`; `cli(prog, argv)` runs an
    entry point in-process under the error contract -> (outcome, last line)."""
    from mlxio.weights import llm
    from mlxio.weights.encoders import default_encoder_path

    w = work / "files49"
    victims = w / "victims"
    w.mkdir()
    tiny = w / "tiny"
    policy = llm.tiny_policy("llama")
    llm.save_model_dir(policy.model, policy.tokenizer._tokenizer, policy.config, tiny)

    # ---- 1: links where a run's file or folder belongs
    def planted(prog, name, kind):
        def case():
            out = w / f"run-{prog}-{name.replace('/', '_')}-{kind.replace(' ', '_')}"
            victim = _plant(out / name, kind, victims)
            # --resume: a fresh run would refuse the folder as another run's (metrics, checkpoints) first
            extra = ["--resume"] if name in ("metrics.jsonl", "rollouts.jsonl", "checkpoints") else []
            argv = ["--preset", "smoke", "--out_dir", str(out), *extra]
            argv += ["--cache_dir", str(w / "cache")] if prog == "xtr_lora" else NO_EVAL
            outcome, detail = cli(prog, argv)
            if outcome == "silent" and kind == "hard link" and not _harmed(victim, kind):  # renamed over: harmless
                return "handled", f"the run replaced {name} by a new file; the other name kept its bytes"
            return _judged(outcome, detail, _harmed(victim, kind))
        record("links49", f"{prog}: {kind} at {name}", case)

    for prog, name, kind in (("xtr_lora", ".lock", "symlink"), ("rlaif_qwen", ".lock", "hard link"),
                             ("rlaif_qwen", ".lock", "dangling link"), ("rlaif_qwen", ".lock", "fifo"),
                             ("xtr_lora", "config.json", "symlink"), ("rlaif_qwen", "config.json", "dangling link"),
                             ("rlaif_qwen", "metrics.jsonl", "symlink"), ("rlaif_qwen", "metrics.jsonl", "hard link"),
                             ("rlaif_qwen", "rollouts.jsonl", "symlink"), ("rlaif_qwen", "checkpoints", "dir link")):
        planted(prog, name, kind)

    from mlxio import rpc
    from mlxio.run.config import to_dict
    from recipes.rlaif_config import PRESETS
    from recipes.rlaif_worker import make_worker

    server = make_worker().server()

    def call(method, **params):
        line = rpc.encode({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        return json.loads(server.handle_line(line.rstrip(b"\n")))

    cfg = {**to_dict(PRESETS["smoke"]), "out_dir": str(w / "worker"),
           "teacher": {**to_dict(PRESETS["smoke"])["teacher"], "url": f"http://bob:{SECRET}@127.0.0.1:9/v1"}}
    started = call("initialize", preset="smoke", config=cfg)

    for name, kind in ((".lock", "symlink"), (".lock", "hard link"), ("checkpoints", "dir link"),
                       ("checkpoints/LATEST", "symlink")):
        def worker_save(name=name, kind=kind):
            folder = w / f"save-{name.replace('/', '_')}-{kind.replace(' ', '_')}"
            victim = _plant(folder / name, kind, victims)
            answer = call("save", dir=str(folder))
            error = answer.get("error", {}).get("message", "")
            outcome = "clear" if error and "\n" not in error else "silent"
            return _judged(outcome, error or json.dumps(answer)[:200], _harmed(victim, kind))
        record("links49", f"worker save: {kind} at {name}", worker_save)

    src = w / "src"
    src.mkdir()
    for i in range(3):
        (src / f"m{i}.py").write_text(f"def parse_date_{i}(text):\n    \"\"\"Parse a date.\"\"\"\n"
                                      f"    day, month = text.split('/')\n    return int(day) + {i}\n")
    enc = str(default_encoder_path())
    index = w / "index"
    built = cli("code_search", ["index", str(src), "--index", str(index), "--model", enc])
    for name, kind in ((".lock", "symlink"), (".lock", "hard link")):
        def index_lock(name=name, kind=kind):
            ix = w / f"ix-{kind.replace(' ', '_')}"
            victim = _plant(ix / name, kind, victims)
            outcome, detail = cli("code_search", ["index", str(src), "--index", str(ix), "--model", enc])
            return _judged(outcome, detail, _harmed(victim, kind))
        record("links49", f"code_search index: {kind} at INDEX/{name}", index_lock)

    queries = w / "queries.jsonl"
    queries.write_text('{"id": "q1", "query": "parse a date"}\n')

    def search_output():
        victim = _plant(w / "results" / "out.jsonl", "symlink", victims)
        outcome, detail = cli("code_search", ["search", "--index", str(index), "--queries", str(queries),
                                              "--output", str(w / "results" / "out.jsonl")])
        return _judged(outcome, detail, _harmed(victim, "symlink"))
    record("links49", "code_search search --output a symlink to another file", search_output)

    def kernel_cache_link():
        cache = w / "ptx-cache"
        victim = _plant(cache / "sub", "dir link", victims)
        archive = _archive(w / "k-sub.tar.gz", [("ptx/sub/a.ptx", b"kernel")])
        outcome, detail = _process(["-m", "mlxio.gpu.kernel_cache_cli", "import", str(archive), "--no-check"], timeout,
                                   {"MLX_PTX_CACHE_DIR": str(cache)})
        return _judged(outcome, detail, _harmed(victim, "dir link"))
    record("links49", "kernel_cache_cli import: a folder link inside the cache", kernel_cache_link)

    # ---- 6: credentials
    from dev.probe_rewards import ReviewServer

    def teacher_with_password():
        out = w / "secret-run"
        with ReviewServer("The code is fine.\nScore: 7/10") as server_:
            url = server_.url.replace("http://", f"http://bob:{SECRET}@")
            import contextlib
            import logging

            logs = io.StringIO()
            handler = logging.StreamHandler(logs)
            logging.getLogger().addHandler(handler)
            try:
                with contextlib.redirect_stdout(io.StringIO()) as printed:
                    outcome, detail = cli("rlaif_qwen", ["--preset", "smoke", "--out_dir", str(out), *NO_EVAL,
                                                         "--teacher.url", url, "--rewards.ai_feedback", "0.5"])
            finally:
                logging.getLogger().removeHandler(handler)
        leaked = _leaks(out, detail, logs.getvalue(), printed.getvalue())
        if leaked:
            return "damaged", f"password written or printed: {leaked[:3]}"
        return ("handled" if outcome == "silent" else outcome), f"no password in {sum(1 for _ in out.rglob('*'))} " \
                                                               f"files, the log or the output; {detail[:120]}"
    record("secrets49", "rlaif_qwen --teacher.url http://bob:PASSWORD@host/v1 (a run to its end)", teacher_with_password)

    def bad_url_with_password():
        outcome, detail = cli("rlaif_qwen", ["--preset", "smoke", "--out_dir", str(w / "secret-bad"),
                                             "--teacher.url", f"ftp://bob:{SECRET}@host/v1"])
        return ("damaged", "password in the error line: " + detail) if SECRET in detail else (outcome, detail)
    record("secrets49", "rlaif_qwen --teacher.url ftp://bob:PASSWORD@host (refused)", bad_url_with_password)

    def worker_answer():
        text = json.dumps(started)
        return ("damaged", "password in the worker's answer") if SECRET in text else (
            "handled", "initialize's config: " + json.dumps(started.get("result", {}).get("config", {}).get("teacher"))[:160])
    record("secrets49", "worker initialize with a teacher URL holding a password", worker_answer)

    # ---- 7: sizes nobody checked
    def lying_model(field, value, prog):
        def case():
            if prog == "rlaif_qwen":
                folder = w / f"tiny-{field}-{value}"
                shutil.copytree(tiny, folder)
            else:
                folder = w / f"enc-{field}-{value}"
                shutil.copytree(enc, folder, symlinks=False)
            config = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**config, field: value}))
            if prog == "rlaif_qwen":
                return cli(prog, ["--preset", "smoke", "--out_dir", str(w / f"lying-{field}"), *NO_EVAL, "--model", str(folder)])
            return cli("code_search", ["index", str(src), "--index", str(w / f"ix-lying-{field}"), "--model", str(folder)])
        return case
    record("sizes49", "rlaif_qwen --model: config.json claims 1,000,000 layers", lying_model("num_hidden_layers", 1_000_000, "rlaif_qwen"))
    record("sizes49", "code_search index --model: config.json claims 1,000,000 layers", lying_model("num_hidden_layers", 1_000_000, "code_search"))
    record("sizes49", "code_search index --model: hidden_size 768 against 384-wide weights", lying_model("hidden_size", 768, "code_search"))

    def huge_prompt():
        answer = call("generate", prompts=["x" * 4_500_000], n=1, max_tokens=4)
        after = call("generate", prompts=["def f"], n=1, max_tokens=2)
        error = answer.get("error", {}).get("message", "")
        if not error:
            return "silent", "the 4.5 MB prompt was generated from"
        return ("clear" if "result" in after else "unclear"), error[:200]
    record("sizes49", "worker generate: one 4.5 MB prompt", huge_prompt)

    def long_problem():
        rows = [{"task_id": f"T/{i}", "prompt": f"def add{i}(a, b):\n", "entry_point": f"add{i}",
                 "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"} for i in range(8)]
        rows[3]["prompt"] = "# " + "x" * 4_500_000 + "\ndef add3(a, b):\n"
        problems = w / "long-problem.jsonl"
        problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return cli("rlaif_qwen", ["--preset", "smoke", "--out_dir", str(w / "long-problem"), *NO_EVAL,
                                  "--data.problems", str(problems)])
    record("sizes49", "rlaif_qwen --data.problems: one 4.5 MB prompt", long_problem)

    fifo = w / "archive.fifo"
    os.mkfifo(fifo)
    sparse = w / "sparse.tar.gz"
    with open(sparse, "wb") as handle:
        handle.truncate(2 << 30)
    for what, archive in (("/dev/zero", "/dev/zero"), ("a FIFO", fifo), ("a 2 GiB sparse file", sparse),
                          ("a member claiming 5 GiB", _huge_member_archive(w / "huge.tar.gz"))):
        record("sizes49", f"kernel_cache_cli import {what}",
               lambda archive=archive: _process(["-m", "mlxio.gpu.kernel_cache_cli", "import", str(archive)], timeout,
                                                {"MLX_PTX_CACHE_DIR": str(w / "ptx-sizes")}))

    def cache_files(kind):
        def case():
            from mlxio.data.token_cache import build_or_open, open_cache
            from mlxio.errors import MlxioError
            from mlxio.rl.rewards import RewardCache

            try:
                if kind == "reward":
                    folder = w / "rc-fifo"
                    folder.mkdir()
                    os.mkfifo(folder / "seg-00000000000000000001-1-00000000.jsonl")
                    RewardCache(folder)
                else:
                    cache = build_or_open(w / "tc", {"q": ["a", "bb"]}, lambda texts, n: [[1] * len(t) for t in texts],
                                          tokenizer_id="t", max_lengths={"q": 4})
                    (cache.path / "meta.json").write_text(json.dumps({"fields": ["q"], "n": "2", "max_lengths": {"q": 4}}))
                    open_cache(cache.path)
            except MlxioError as err:
                line = err.contract_line()
                return ("clear" if "\n" not in line else "unclear"), line
            return "silent", "opened"
        return case
    record("sizes49", "reward cache: a FIFO named like a segment", cache_files("reward"))
    record("sizes49", "token cache: meta.json with a string n", cache_files("token"))

    # ---- 8: inputs that crashed, or were taken silently
    deep = b"[" * 200_000 + b"]" * 200_000
    for what, archive in (("a manifest that is a list", _archive(w / "list.tar.gz", [], b"[1, 2]")),
                          ("a manifest that is a string", _archive(w / "str.tar.gz", [], b'"ptx"')),
                          ("a manifest nested 200,000 deep", _archive(w / "deep.tar.gz", [], deep)),
                          ("a ptx/../ member", _archive(w / "dotdot.tar.gz", [("ptx/../escape.ptx", b"x")])),
                          ("a ptx/../../ member", _archive(w / "dotdot2.tar.gz", [("ptx/../../escape.ptx", b"x")]))):
        def kernel_case(archive=archive):
            outcome, detail = _process(["-m", "mlxio.gpu.kernel_cache_cli", "import", str(archive)], timeout,
                                       {"MLX_PTX_CACHE_DIR": str(w / "ptx-8" / "ptx")})
            escaped = [p for p in (w / "ptx-8").rglob("escape.ptx")] + list(w.glob("escape.ptx"))
            return ("damaged", f"unpacked outside: {escaped}") if escaped else (outcome, detail)
        record("tracebacks49", f"kernel_cache_cli import: {what}", kernel_case)
    record("tracebacks49", "MLXIO_CACHE_LIMIT_MB = 30 nines",
           lambda: _process(["-c", "from mlxio.runtime import setup; setup()"], timeout, {"MLXIO_CACHE_LIMIT_MB": "9" * 30}))
    record("tracebacks49", "rlaif_qwen --model: a string hidden_size", lying_model("hidden_size", "64", "rlaif_qwen"))
    record("tracebacks49", "code_search index --model: a string hidden_size", lying_model("hidden_size", "384", "code_search"))

    def class_entry_point():
        problems = w / "class.jsonl"
        problems.write_text(json.dumps({"task_id": "T/0", "prompt": "def f():\n", "entry_point": "class",
                                        "test": "def check(candidate):\n    assert candidate() == 1\n"}) + "\n")
        return cli("rlaif_qwen", ["--preset", "smoke", "--out_dir", str(w / "class-run"), *NO_EVAL,
                                  "--data.problems", str(problems)])
    record("tracebacks49", "rlaif_qwen --data.problems: entry_point 'class'", class_entry_point)

    def max_chars_folder():
        from mlxio.data.xtr_data import DataConfig, load_data

        lib = w / "long-lib"
        lib.mkdir()
        body = "".join(f"    value_{i} = x * {i} + {i}\n" for i in range(30))
        for f in range(12):
            (lib / f"mod{f}.py").write_text("".join(
                f'def fn_{f}_{j}(x):\n    """Compute the {j}th polynomial value of x in module {f}."""\n{body}    return x\n\n'
                for j in range(6)))
        data = DataConfig(source=str(lib), packages=(), heldout_packages=(), max_chars=60, eval_queries=5,
                          min_eval_queries=1, min_eval_candidates=1, dev_queries=0, max_eval_candidates=0, hard_negatives=0)
        loaded = load_data(data, w / "cache-chars", seed=0)
        longest = max(len(t) for p in loaded.train for t in (p.query, p.code))
        return ("handled" if longest <= 60 else "silent"), f"longest training text {longest} characters (max_chars 60)"
    record("tracebacks49", "--data.max_chars 60 with a folder source", max_chars_folder)

    def no_segments():
        from mlxio.search import store

        copy = w / "index-empty"
        shutil.copytree(index, copy)
        manifest = store.current(copy) / "manifest.json"
        data = json.loads(manifest.read_text())
        os.chmod(manifest, 0o644)
        manifest.write_text(json.dumps({**data, "segments": []}))
        return cli("code_search", ["search", "--index", str(copy), "--queries", str(queries)])
    record("tracebacks49", "code_search search: an index manifest listing no segments", no_segments)

    def nan_id():
        bad = w / "nan.jsonl"
        bad.write_text('{"id": NaN, "query": "parse a date"}\n')
        return cli("code_search", ["search", "--index", str(index), "--queries", str(bad),
                                   "--output", str(w / "nan-out.jsonl")])
    record("tracebacks49", "code_search search: a NaN query id", nan_id)
    if built[0] not in ("silent", "handled"):
        record("tracebacks49", "(setup) code_search index of the probe's folder", lambda: built)
