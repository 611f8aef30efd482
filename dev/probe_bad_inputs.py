"""Probe: run a few hundred bad inputs and faults through every entry point and count what
happens. Writes benchmarks/results/cpu/probe_bad_inputs.json.

    python -m dev.probe_bad_inputs [--out FILE] [--subprocess-cases 12] [--timeout 60]

Every case is a mistake a user makes (a wrong flag value, a config file of the wrong shape, a
bad data line, a model folder without tokenizer, an output path that is a file, a full disk
during export, a resume with other settings, untrusted code filling its disk or memory) or a
fault. Each runs through the entry point's own `cli_main` (the same code `python -m` runs) in
this process, under a per-case alarm, with stderr captured; a sample also runs as real
`python -m` processes. Each outcome is one of:
  clear      exit 1 or 2 and stderr's last line is `<prog>: error: <what> (<where>); <fix>`
  unclear    exit 1 or 2 but not that one line
  traceback  an exception escaped the entry point (or "Traceback" on stderr)
  hang       no result within the per-case timeout
  silent     exit 0 on a bad input (a run that "worked" but means nothing)
  damaged    a previous output or input file changed or was left half-written
  handled    a case whose right answer is not an error, done as documented (odd files in an
             indexed folder skipped and counted, readers during updates served, two writers
             serialised, a killed export's temp folder swept)
Sandbox cases count `contained` (the quota held) or `escaped`. Group `rewards49`
(`dev.probe_rewards`) holds the rewards' judges: slow and planted teacher reviews, problem
files whose tests cannot judge, rewards that never arrive. Group `files49`
(`dev.probe_run_folders`) holds links planted in run folders, credentials in a teacher URL,
sizes nobody checked and inputs that crashed. Groups `inputs38` and `faults38`
are issue 38's classes (settings refused up front, memory bounds, special files, byte caps,
model folders, out_dir locks, the search index under updates, litter) and cases of our own. The probe fails fast on
purpose: only a few cases train (the RLAIF smoke preset, a tiny random model, seconds).
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(xtr_lora|rlaif_qwen|python -m recipes.code_search|python -m recipes.rlaif_worker): error: "
                  r"[^\n]+ \([^\n]*\); [^\n]+$")
GOOD = ("clear", "contained", "handled")  # handled: a bad input the command copes with as documented (exit 0)


class Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise Hang()


def snapshot(folder: Path) -> dict[str, str]:
    if folder.is_file():
        return {"": hashlib.sha256(folder.read_bytes()).hexdigest()}
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def classify(code, err_text: str, exc: BaseException | None) -> str:
    if isinstance(exc, Hang):
        return "hang"
    if exc is not None or "Traceback (most recent call last)" in err_text:
        return "traceback"
    if code == 0:
        return "silent"
    last = err_text.rstrip("\n").splitlines()[-1] if err_text.strip() else ""
    return "clear" if code in (1, 2) and LINE.match(last) else "unclear"


def run_in_process(prog: str, fn, argv: list[str], timeout: float,
                   out: io.StringIO | None = None) -> tuple[str, int | None, str, float]:
    """(outcome, exit code, stderr, seconds); `out` collects stdout and the log's lines."""
    import logging

    from mlxio.errors import cli_main

    err = io.StringIO()
    handler = None
    if out is not None:
        handler = logging.StreamHandler(out)
        logging.getLogger().addHandler(handler)
    code, exc = None, None
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out if out is not None else io.StringIO()):
            cli_main(prog, fn, argv)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException as e:  # noqa: BLE001 - what the probe counts
        exc = e
        err.write("".join(traceback.format_exception(e)))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if handler is not None:
            logging.getLogger().removeHandler(handler)
    return classify(code, err.getvalue(), exc), code, err.getvalue(), time.perf_counter() - start


def run_subprocess(module: str, argv: list[str], timeout: float) -> tuple[str, int | None, str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        return "hang", None, str(e.stderr or ""), time.perf_counter() - start
    return classify(proc.returncode, proc.stderr, None), proc.returncode, proc.stderr, time.perf_counter() - start


# ---------------------------------------------------------------- the cases

def bad_flag_values(kind) -> list[str]:
    """Flag texts that are wrong for every field of this type (whatever its declared range)."""
    import typing

    origin, args = typing.get_origin(kind), typing.get_args(kind)
    inner = [a for a in args if a is not type(None)] if args and origin is not tuple else [kind]
    base = inner[0] if inner else kind
    if typing.get_origin(base) is tuple:
        return ["\ud800", "a\x00b"]
    if base is bool:
        return ["maybe", "2", ""]
    if base is int:
        return ["-1", "1.5", "abc", "99999999999"]
    if base is float:
        return ["-1", "nan", "inf", "abc", "1e400"]
    return ["\x00", "x\ud800"]


def config_cases(work: Path) -> list[dict]:
    from mlxio.run import config
    from recipes import rlaif_config, xtr_lora_config

    cases = []
    for prog, cls in (("xtr_lora", xtr_lora_config.Config), ("rlaif_qwen", rlaif_config.Config)):
        for name, kind in config.leaf_fields(cls).items():
            for text in bad_flag_values(kind):
                if name in ("model", "teacher.url", "teacher.local", "data.source", "data.problems") and "\x00" not in text \
                        and "\ud800" not in text:
                    continue
                cases.append({"class": "config flag", "prog": prog, "argv": [f"--{name}", text]})
    shapes = [b"[]", b'"x"', b"1", b"null", b'{"train": 5}', b'{"optim": []}', b'{"export": "false"}',
              b'{"lora": {"targets": "query"}}', b'{"optim": {"lr": -1}}', b'{"optim": {"lrr": 1}}',
              b"{", b"\xff\xfe{}", b"[" * 5000 + b"]" * 5000, b'{"seed": 1, "seed": 2}', b'{"seed": ' + b"9" * 5000 + b"}",
              b'{"optim": {"lr": NaN}}', b'{"optim": {"lr": 1e999}}', b"", b"\x00"]
    for prog in ("xtr_lora", "rlaif_qwen"):
        for i, raw in enumerate(shapes):
            path = work / f"{prog}-config-{i}.json"
            path.write_bytes(raw)
            cases.append({"class": "config file", "prog": prog, "argv": ["--config", str(path)]})
        cases.append({"class": "config file", "prog": prog, "argv": ["--config", str(work / "missing.json")]})
        for argv in (["--optim.l", "1e-4"], ["--pre", "smoke"], ["--bogus", "1"], ["--preset", "nope"], ["--lenien"]):
            cases.append({"class": "usage", "prog": prog, "argv": argv})
    return cases


def path_cases(work: Path) -> list[dict]:
    from mlxio.weights.encoders import default_encoder_path

    a_file = work / "a_file"
    a_file.write_text("keep me")
    notok = work / "notok"
    notok.mkdir()
    for name in ("config.json", "model.safetensors"):
        (notok / name).write_bytes((default_encoder_path() / name).read_bytes())
    llm_notok = work / "llm_notok"
    llm_notok.mkdir()
    (llm_notok / "config.json").write_text('{"model_type": "llama"}')
    garbage = work / "garbage.gguf"
    garbage.write_bytes(os.urandom(4096))
    bad_cfg_model = work / "bad_cfg_model"
    bad_cfg_model.mkdir()
    (bad_cfg_model / "config.json").write_text("{not json")
    (bad_cfg_model / "tokenizer.json").write_text("{}")
    smoke_x = ["--preset", "smoke", "--cache_dir", str(work / "cache")]
    smoke_r = ["--preset", "smoke"]
    keep = {"a_file": a_file}
    cases = []
    for prog, out_flag, smoke in (("xtr_lora", "--out_dir", smoke_x), ("rlaif_qwen", "--out_dir", smoke_r)):
        cases += [
            {"class": "path", "prog": prog, "argv": [*smoke, out_flag, str(a_file)], "keep": keep},
            {"class": "path", "prog": prog, "argv": [*smoke, out_flag, str(a_file / "sub")], "keep": keep},
            {"class": "path", "prog": prog, "argv": [*smoke, out_flag, ""]},
            {"class": "model", "prog": prog, "argv": [*smoke, "--model", "/nonexistent", out_flag, str(work / f"{prog}-m1")]},
            {"class": "model", "prog": prog, "argv": [*smoke, "--model", str(garbage), out_flag, str(work / f"{prog}-m2")]},
            {"class": "model", "prog": prog, "argv": [*smoke, "--model", str(bad_cfg_model), out_flag, str(work / f"{prog}-m3")]},
            {"class": "model", "prog": prog, "argv": [*smoke, "--model", str(notok if prog == "xtr_lora" else llm_notok),
                                                      out_flag, str(work / f"{prog}-m4")]},
        ]
    cases.append({"class": "path", "prog": "xtr_lora", "argv": [*smoke_x, "--data.source", str(work / "none.jsonl"),
                                                                 "--out_dir", str(work / "x-d0")]})
    cases.append({"class": "path", "prog": "rlaif_qwen", "argv": [*smoke_r, "--data.problems", str(work / "none.jsonl"),
                                                                   "--out_dir", str(work / "r-d0")]})
    cases.append({"class": "model", "prog": "xtr_lora", "argv": [*smoke_x, "--lora.targets", "nonexistent_layer",
                                                                  "--out_dir", str(work / "x-t")]})
    cases.append({"class": "model", "prog": "rlaif_qwen", "argv": [*smoke_r, "--lora.targets", "query,value",
                                                                    "--out_dir", str(work / "r-t")]})
    cases.append({"class": "model", "prog": "rlaif_qwen", "argv": [*smoke_r, "--lora_layers", "99",
                                                                    "--out_dir", str(work / "r-l")]})
    return cases


BAD_LINES = {
    "lone surrogate": b'{"query": "a\\ud800b", "code": "def f(): pass"}',
    "deep nesting": b'{"query": "q", "code": "c", "meta": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    "oversized line": b'{"query": "q", "code": "' + b"x" * (17 << 20) + b'"}',
    "NUL byte": b'{"query": "q\x00", "code": "c"}',
    "NUL escape": b'{"query": "q\\u0000", "code": "c"}',
    "invalid UTF-8": b'{"query": "\xff", "code": "c"}',
    "BOM inside": b'{"query": "q", "code": "c"}\xef\xbb\xbf',
    "not an object": b"[1, 2]",
    "missing field": b'{"query": "q"}',
    "empty field": b'{"query": " ", "code": "c"}',
    "wrong type": b'{"query": 3, "code": "c"}',
    "truncated JSON": b'{"query": "q", "co',
}
GOOD_PAIR = b'{"query": "parse a date", "code": "def parse(s):\\n    return s"}'
GOOD_PROBLEM = json.dumps({"task_id": "T/0", "prompt": "def add(a, b):\n", "entry_point": "add",
                           "test": "def check(c):\n    assert c(1, 2) == 3\n"}).encode()


def problem_line(bad: bytes) -> bytes:
    """The same defect in an RLAIF problem line (prompt field; an empty prompt is allowed, so
    the empty field is the entry point there)."""
    if bad == BAD_LINES["empty field"]:
        return b'{"task_id": "T/1", "entry_point": " ", "prompt": "p", "test": "t"}'
    row = bad.replace(b'"query"', b'"prompt"').replace(b'"code"', b'"test"')
    if row.startswith(b"{") and b'"task_id"' not in row and b"[1, 2]" not in row:
        row = b'{"task_id": "T/1", "entry_point": "f", ' + row[1:]
    return row


def data_cases(work: Path) -> list[dict]:
    cases = []
    for name, bad in BAD_LINES.items():
        pairs = work / f"pairs-{len(cases)}.jsonl"
        pairs.write_bytes(GOOD_PAIR + b"\n" + bad + b"\n" + GOOD_PAIR + b"\n")
        cases.append({"class": "data line", "what": name, "prog": "xtr_lora",
                      "argv": ["--preset", "smoke", "--data.source", str(pairs), "--out_dir", str(work / "xd"),
                               "--cache_dir", str(work / "cache")], "keep": {"data": pairs}})
        problems = work / f"problems-{len(cases)}.jsonl"
        problems.write_bytes(GOOD_PROBLEM + b"\n" + problem_line(bad) + b"\n")
        cases.append({"class": "data line", "what": name, "prog": "rlaif_qwen",
                      "argv": ["--preset", "smoke", "--data.problems", str(problems), "--out_dir", str(work / "rd")],
                      "keep": {"data": problems}})
    return cases


def lenient_counts(work: Path) -> dict:
    """Lenient reading: every bad line counted by reason, none accepted (nothing reaches a tokenizer)."""
    from mlxio.data.pairs_jsonl import read_jsonl

    path = work / "lenient.jsonl"
    path.write_bytes(b"\n".join([GOOD_PAIR, *BAD_LINES.values(), GOOD_PAIR]) + b"\n")
    pairs, report = read_jsonl(path, lenient=True)
    ok = len(pairs) == 2 and sum(report.skipped.values()) == len(BAD_LINES)
    for p in pairs:
        ok = ok and "\x00" not in p.query and p.query.encode("utf-8", "strict") is not None
    return {"lines": report.lines, "accepted": report.accepted, "skipped": report.skipped, "all_bad_rejected": ok}


def code_search_cases(work: Path) -> list[dict]:
    queries = work / "queries.jsonl"
    queries.write_bytes(b'{"id": 1, "query": "a\\ud800"}\n{oops\n')
    return [
        {"class": "path", "prog": "code_search", "argv": ["search", "--index", str(work / "none"), "q"]},
        {"class": "path", "prog": "code_search", "argv": ["index", str(work / "none"), "--model", "x",
                                                          "--index", str(work / "ix")]},
        {"class": "usage", "prog": "code_search", "argv": ["search", "--ind", str(work), "q"]},
        {"class": "usage", "prog": "code_search", "argv": ["serch"]},
        {"class": "usage", "prog": "code_search", "argv": ["search", "--index", str(work), "--top-k", "x", "q"]},
    ]


# ---------------------------------------------------------------- faults that need setup

def fault_cases(work: Path, timeout: float) -> list[dict]:
    """Each returns a finished record: silent-nothing runs, refused resume, disk full, read-only."""
    import attrs

    from recipes import rlaif_qwen as rq
    from recipes.rlaif_config import PRESETS

    out = []

    def record(cls, what, outcome, detail=""):
        out.append({"class": cls, "what": what, "outcome": outcome, "detail": detail[-400:]})

    # a run whose every update is non-finite (rewards that overflow the group mean)
    @attrs.frozen
    class Huge:
        name: str = "huge"

        def config_key(self):
            return "huge-v1"

        def score(self, problems, completions):
            return [3e38] * len(completions)

    problems = work / "p.jsonl"
    problems.write_bytes(b"\n".join(json.dumps({"task_id": f"T/{i}", "prompt": f"def f{i}(a):\n",
                                                "entry_point": f"f{i}", "test": "def check(c):\n    assert c(2) == 2\n"}).encode()
                                    for i in range(12)) + b"\n")
    run_dir = work / "nonfinite"
    base = PRESETS["smoke"]
    cfg = attrs.evolve(base, out_dir=str(run_dir), train=attrs.evolve(base.train, max_consecutive_skips=10),
                       data=attrs.evolve(base.data, problems=str(problems), heldout_fraction=0.4),
                       eval=attrs.evolve(base.eval, before=False, after=False))
    kind, code, err, _ = run_in_process("rlaif_qwen", lambda argv: rq.run(cfg, extra_rewards=[(Huge(), 1.0)]),
                                        [], timeout)
    exported = (run_dir / "adapters").exists() or (run_dir / "fused").exists()
    record("silent run", "every update non-finite (RLAIF smoke, rewards overflow)",
           "silent" if exported or kind == "silent" else kind, err)

    # the retriever recipe: every loss NaN for fewer steps than the consecutive-skip limit
    from mlxcore.retrieval import objective
    from recipes import xtr_lora

    real_loss = objective.contrastive_loss_fn

    def poisoned(*a):
        loss_fn = real_loss(*a)

        def nan_loss(params, batch, key):
            loss, aux = loss_fn(params, batch, key)
            return loss * float("nan"), aux
        return nan_loss

    objective.contrastive_loss_fn = poisoned
    try:
        run_dir = work / "xtr_nonfinite"
        kind, code, err, _ = run_in_process("xtr_lora", xtr_lora.main, [
            "--preset", "smoke", "--cache_dir", str(work / "cache"), "--out_dir", str(run_dir), "--train.steps", "3",
            "--optim.total_steps", "3", "--train.max_consecutive_skips", "10"], timeout)
    finally:
        objective.contrastive_loss_fn = real_loss
    exported = (run_dir / "merged").exists() or (run_dir / "eval.json").exists()
    record("silent run", "every loss NaN (xtr smoke, 3 steps < skip limit)",
           "silent" if exported or kind == "silent" else kind, err)

    # a finished run, then --resume with other settings: refused, nothing in the run changes
    run_dir = work / "resume"
    argv = ["--preset", "smoke", "--out_dir", str(run_dir), "--data.problems", str(problems), "--data.heldout_fraction", "0.4",
            "--eval.before", "false", "--eval.after", "false", "--train.steps", "2", "--optim.total_steps", "2"]
    kind, code, err, _ = run_in_process("rlaif_qwen", rq.main, argv, timeout)
    if kind != "silent":  # exit 0 is right here: a good run
        record("setup", "resume: first run", kind, err)
    for change in (["--train.seed", "3"], ["--optim.lr", "0.02"], ["--lora.rank", "2"]):
        before = snapshot(run_dir)
        kind, code, err, _ = run_in_process("rlaif_qwen", rq.main, [*argv, "--resume", *change], timeout)
        named = change[0].lstrip("-") in err and "->" in err
        outcome = "damaged" if snapshot(run_dir) != before else (kind if named or kind != "clear" else "unclear")
        record("damage", f"refused resume {' '.join(change)}", outcome, err)

    # disk full during every export kind (a real tmpfs as root; else a simulated ENOSPC)
    out += disk_full_records(work)

    # untrusted code: disk and memory quotas, weak backend refused
    out += sandbox_records()
    return out


def disk_full_records(work: Path) -> list[dict]:
    import mlx.core as mx

    from mlxcore.train import lora
    from mlxcore.train.lora import LoraConfig
    from mlxcore.train.tree import combine
    from mlxio.errors import DiskError
    from mlxio.weights import export, llm, llm_lora
    from mlxio.weights.encoders import default_encoder_path, load_encoder

    records = []
    disk = work / "disk"
    disk.mkdir()
    real = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200m", "tmpfs", str(disk)],
                                                capture_output=True).returncode == 0
    try:
        encoder = load_encoder(str(default_encoder_path()))
        dims = lora.target_dims(encoder.params, ("query", "value"))
        cfg = LoraConfig(rank=4, alpha=8.0, targets=("query", "value"))
        policy = llm.tiny_policy("llama", seed=0)
        lora_tree = llm_lora.apply_lora(policy.model, LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj")), None,
                                        mx.random.key(0))
        exports = {
            "merged model": lambda d, s: export.export_merged(encoder, combine(encoder.params, lora.init(
                mx.random.key(s), dims, 4)), cfg.scale, d),
            "PEFT adapter": lambda d, s: export.export_peft(encoder, combine(encoder.params, lora.init(
                mx.random.key(s), dims, 4)), cfg, d, "base"),
            "mlx-lm adapters": lambda d, s: llm_lora.save_adapters(policy.model, lora_tree, LoraConfig(
                rank=4, alpha=8.0, targets=("q_proj", "v_proj")), None, d),
            "fused model": lambda d, s: llm_lora.fuse(policy, lora_tree, d),
        }
        for name, write in exports.items():
            target = disk / name.replace(" ", "_")
            write(target, 0)
            before = snapshot(target)
            size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
            for fraction in (0.0, 0.5, 0.9):
                if real:
                    st = os.statvfs(disk)
                    with open(disk / "ballast", "ab") as f:
                        f.write(b"\0" * max(st.f_bavail * st.f_frsize - int(size * fraction), 0))
                    patch = contextlib.nullcontext()
                else:
                    patch = _simulated_enospc(fraction)
                try:
                    with patch:
                        write(target, 1)
                    outcome, detail = "silent", "export claimed success on a full disk"
                except DiskError as err:
                    outcome, detail = "clear", str(err)
                except BaseException as err:  # noqa: BLE001
                    outcome, detail = "traceback", repr(err)
                leftovers = [p.name for p in disk.iterdir() if p.name.startswith(".")]
                if snapshot(target) != before or leftovers:
                    outcome = "damaged"
                if real:
                    (disk / "ballast").unlink()
                records.append({"class": "damage", "what": f"disk full ({'tmpfs' if real else 'simulated'}, "
                                f"{int(fraction * 100)}% of the export fits): {name}", "outcome": outcome,
                                "detail": detail[-300:]})
    finally:
        if real:
            subprocess.run(["umount", "-l", str(disk)], check=False)
    return records


@contextlib.contextmanager
def _simulated_enospc(fraction: float):
    import errno

    import mlx.core as mx

    real = mx.save_safetensors

    def write(path, arrays, metadata=None):
        real(path, arrays, metadata=metadata)
        with open(path, "r+b") as f:
            f.truncate(int(os.path.getsize(path) * fraction))
        raise OSError(errno.ENOSPC, "No space left on device", path)
    mx.save_safetensors = write
    try:
        yield
    finally:
        mx.save_safetensors = real


def sandbox_records() -> list[dict]:
    from mlxio.sandbox import runner
    from mlxio.sandbox.runner import SandboxError, SandboxLimits, require_isolation, run_check

    records = []
    limits = SandboxLimits(timeout_s=20.0, memory_mb=256, max_processes=16, max_file_mb=4, disk_mb=8)
    fill = ("def fill(where):\n    import os\n    n = 0\n    try:\n        for i in range(64):\n"
            "            with open(os.path.join(where, f'f{i}'), 'wb') as h:\n                h.write(b'x' * (1 << 20))\n"
            "            n += 1\n    except OSError:\n        pass\n    return n\n")
    test = "def check(c):\n    assert c(WHERE) == 64\n"  # passes only if the quota did NOT hold
    hog = ("def hog():\n    import os, time\n    pids = []\n    for _ in range(4):\n        pid = os.fork()\n"
           "        if pid == 0:\n            b = bytearray(150 << 20)\n            for i in range(0, len(b), 4096):\n"
           "                b[i] = 1\n            time.sleep(1.5)\n            os._exit(0)\n        pids.append(pid)\n"
           "    return sum(os.waitpid(p, 0)[1] == 0 for p in pids)\n")
    if runner.sandbox_backend() == "bwrap":
        v = run_check(fill, test.replace("WHERE", "'/tmp'"), "fill", limits)
        records.append({"class": "sandbox", "what": "fill 64 MiB of /tmp under an 8 MiB quota (bwrap)",
                        "outcome": "escaped" if v.status == "passed" else "contained", "detail": v.status})
        v = run_check(hog, "def check(c):\n    assert c() == 4\n", "hog", limits)
        records.append({"class": "sandbox", "what": "4 processes x 150 MiB under a 256 MiB bound (bwrap)",
                        "outcome": "escaped" if v.status == "passed" else "contained", "detail": v.status})
    real_backend = runner.sandbox_backend
    try:
        runner.sandbox_backend = lambda: "none"
        v = run_check(fill, test.replace("WHERE", "'.'"), "fill", limits)
        records.append({"class": "sandbox", "what": "fill 64 MiB of the work dir under an 8 MiB quota (weak backend)",
                        "outcome": "escaped" if v.status == "passed" else "contained", "detail": v.status})
        try:
            require_isolation(False, "--sandbox.allow_weak true")
            records.append({"class": "sandbox", "what": "weak backend without opt-in", "outcome": "escaped"})
        except SandboxError as err:
            records.append({"class": "sandbox", "what": "weak backend without opt-in", "outcome": "contained",
                            "detail": str(err)})
    finally:
        runner.sandbox_backend = real_backend
    return records


# ---------------------------------------------------------------- issue 38: inputs checked before the work

def _model_dirs(work: Path) -> dict[str, Path]:
    """Model folders a user gets wrong: empty tokenizer.json, another model's tokenizer, special files."""
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers

    from mlxio.weights import llm
    from mlxio.weights.encoders import default_encoder_path

    enc = default_encoder_path()
    root = work / "models38"
    root.mkdir()
    tiny = llm.tiny_policy("llama")
    llm.save_model_dir(tiny.model, tiny.tokenizer._tokenizer, tiny.config, root / "tiny")
    other = Tokenizer(models.WordLevel({f"w{i}": i for i in range(40000)}, unk_token="w0"))
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    out = {}
    for name, files in (("enc empty tokenizer.json", {"tokenizer.json": ""}),
                        ("enc another model's tokenizer", {"tokenizer.json": other.to_str()}),
                        ("enc empty vocab.txt", {"vocab.txt": ""}),
                        ("enc FIFO tokenizer.json", {"tokenizer.json": None})):
        d = root / name.replace(" ", "_").replace("'", "")
        d.mkdir()
        for f in ("config.json", "model.safetensors"):
            (d / f).symlink_to(enc / f)
        for f, text in files.items():
            os.mkfifo(d / f) if text is None else (d / f).write_text(text)
        out[name] = d
    for name, f, text in (("llm empty tokenizer.json", "tokenizer.json", ""),
                          ("llm another model's tokenizer", "tokenizer.json", other.to_str()),
                          ("llm FIFO config.json", "config.json", None),
                          ("llm FIFO tokenizer.json", "tokenizer.json", None)):
        d = root / name.replace(" ", "_").replace("'", "")
        shutil.copytree(root / "tiny", d)
        (d / f).unlink()
        os.mkfifo(d / f) if text is None else (d / f).write_text(text)
        out[name] = d
    return out


def _odd_folder(folder: Path) -> Path:
    """A source folder with a FIFO, a link to /dev/zero, a dangling link and a Latin-1 file named *.py."""
    folder.mkdir(parents=True)
    (folder / "good.py").write_text("def add(a, b):\n    '''Add two numbers together.'''\n    total = a + b\n"
                                    "    return total\n")
    (folder / "latin1.py").write_bytes(b"def f(x):\n    s = '\xe9t\xe9'\n    return s + x\n")
    os.mkfifo(folder / "pipe.py")
    (folder / "zero.py").symlink_to("/dev/zero")
    (folder / "gone.py").symlink_to(folder / "nowhere")
    return folder


def issue38_cases(work: Path) -> list[dict]:
    """Settings refused before anything loads, memory bounds, special files and byte caps as
    every file option, model folders, out_dir checks, damaged index manifests."""
    import gzip

    from mlxio.weights.encoders import default_encoder_path

    w = work / "i38"
    w.mkdir()
    sx = ["--preset", "smoke", "--cache_dir", str(work / "cache")]
    sr = ["--preset", "smoke"]
    cases = []

    def add(cls, prog, argv, what=None, keep=None):
        cases.append({"class": cls, "prog": prog, "argv": argv, **({"what": what} if what else {}),
                      **({"keep": keep} if keep else {})})

    # settings (tracebacks before; some only after the model loaded) and silent ones
    for url in ("http://127.0.0.1:99999", "http://[::1", "http://", "http://h:abc/v1", "ftp://h/v1", "http://a b",
                "http://h:0/v1", "https://", "http://:8080"):
        add("settings (38)", "rlaif_qwen", [*sr, "--out_dir", str(w / "r-url"), "--teacher.url", url])
    for argv in (["--lora.targets", ""], ["--model", "tiny:nope"], ["--model", "tiny:mistral-q4"], ["--model", ""],
                 ["--teacher.local", ""], ["--data.problems", ""], ["--optim.warmup_steps", "1000000"],
                 ["--optim.warmup_steps", "4"], ["--out_dir", str(w) + "/a" * 1500],
                 ["--out_dir", str(w) + ("/" + "b" * 200) * 30], ["--out_dir", str(w / ("c" * 300))],
                 ["--out_dir", "/proc/probe38"]):
        add("settings (38)", "rlaif_qwen", [*sr, *argv], what=" ".join(argv)[:100])
    for argv in (["--train.micro_batch", "1"], ["--model", ""], ["--data.source", ""], ["--optim.warmup_steps", "1000000"],
                 ["--optim.warmup_steps", "8"], ["--cache_dir", str(w) + "/a" * 1500],
                 ["--out_dir", str(w / ("d" * 300))]):
        add("settings (38)", "xtr_lora", [*sx, "--out_dir", str(w / "x-set"), *argv] if argv[0] != "--out_dir"
            else [*sx, *argv], what=" ".join(argv)[:100])
    # settings that cannot fit: refused naming the option, not started and stalled
    add("bounds (38)", "xtr_lora", [*sx, "--out_dir", str(w / "x-b1"), "--train.micro_batch", "65536", "--train.accum", "1"])
    add("bounds (38)", "xtr_lora", [*sx, "--out_dir", str(w / "x-b2"), "--train.eval_batch", "65536"])
    add("bounds (38)", "rlaif_qwen", ["--preset", "quick", "--out_dir", str(w / "r-b1"), "--group_size", "4096",
                                      "--eval.before", "false"])
    src = w / "src"
    src.mkdir()
    (src / "a.py").write_text("def f(x):\n    y = x + 1\n    return y\n")
    enc = str(default_encoder_path())
    for extra in (["--max-doc-len", "100000"], ["--max-doc-len", "512", "--batch-size", "1000000"],
                  ["--max-query-len", "4096"]):
        add("bounds (38)", "code_search", ["index", str(src), "--model", enc, "--index", str(w / "ix-b"), *extra])

    # special files as every file option: a FIFO, /dev/zero, a link to it, a folder, a link loop
    fifo = w / "fifo.jsonl"
    os.mkfifo(fifo)
    link = w / "zero.jsonl"
    link.symlink_to("/dev/zero")
    loop = w / "loop.json"
    loop.symlink_to(loop)
    odd = {"FIFO": fifo, "/dev/zero": Path("/dev/zero"), "link to /dev/zero": link, "folder": w, "link loop": loop}
    index = w / "ix-q"
    (index / "gen-000001").mkdir(parents=True)
    (index / "CURRENT").write_text("gen-000001\n")
    for kind, path in odd.items():
        add("special files (38)", "xtr_lora", [*sx, "--config", str(path)], what=f"--config {kind}")
        add("special files (38)", "rlaif_qwen", [*sr, "--config", str(path)], what=f"--config {kind}")
        add("special files (38)", "rlaif_qwen", [*sr, "--out_dir", str(w / "r-sf"), "--data.problems", str(path)],
            what=f"--data.problems {kind}")
        add("special files (38)", "code_search", ["search", "--index", str(index), "--queries", str(path)],
            what=f"search --queries {kind}")
        if kind != "folder":
            add("special files (38)", "code_search", ["index", str(path), "--model", enc, "--index", str(w / "ix-s")],
                what=f"index SOURCE {kind}")
    for kind in ("FIFO", "link to /dev/zero"):
        add("special files (38)", "xtr_lora", [*sx, "--out_dir", str(w / "x-sf"), "--data.source", str(odd[kind])],
            what=f"--data.source {kind}")
    # byte caps: a sparse 11 MB config, a 300 MB queries file, a gzip bomb of problems
    big = w / "big.json"
    with open(big, "wb") as f:
        f.truncate(11_000_000)
    add("byte caps (38)", "xtr_lora", [*sx, "--config", str(big)], what="--config of 11 MB")
    huge = w / "huge.jsonl"
    with open(huge, "wb") as f:
        f.truncate(300 << 20)
    add("byte caps (38)", "code_search", ["search", "--index", str(index), "--queries", str(huge)],
        what="--queries of 300 MB")
    bomb = w / "bomb.jsonl.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        for _ in range(40):
            f.write(b"\n" * (16 << 20))  # 640 MiB of newlines in about 640 KiB
    add("byte caps (38)", "rlaif_qwen", [*sr, "--out_dir", str(w / "r-bomb"), "--data.problems", str(bomb)],
        what="--data.problems gzip bomb (640 MiB)")
    empty = w / "empty.jsonl"
    empty.write_text("")
    add("byte caps (38)", "code_search", ["search", "--index", str(index), "--queries", str(empty)], what="--queries empty")

    # model folders
    for name, path in _model_dirs(work).items():
        if name.startswith("enc"):
            add("model folders (38)", "xtr_lora", [*sx, "--model", str(path), "--out_dir", str(w / "x-m")], what=name)
            add("model folders (38)", "code_search", ["index", str(src), "--model", str(path), "--index", str(w / "ix-m")],
                what=f"index: {name}")
        else:
            add("model folders (38)", "rlaif_qwen", [*sr, "--model", str(path), "--out_dir", str(w / "r-m")], what=name)

    # out_dir: another run's results (a fresh run would replace config.json and metrics.jsonl), a FIFO
    done = w / "finished"
    (done / "checkpoints" / "step-00000004").mkdir(parents=True)
    (done / "metrics.jsonl").write_text('{"step": 4, "loss": 1.0}\n')
    (done / "config.json").write_text("{}")
    (done / "eval.json").write_text("{}")
    add("out_dir (38)", "rlaif_qwen", [*sr, "--out_dir", str(done)], what="fresh run into a finished run's folder",
        keep={"metrics": done / "metrics.jsonl", "config": done / "config.json", "eval": done / "eval.json"})
    add("out_dir (38)", "xtr_lora", [*sx, "--out_dir", str(done)], what="fresh retriever run into a finished run's folder",
        keep={"metrics": done / "metrics.jsonl", "config": done / "config.json"})
    add("out_dir (38)", "rlaif_qwen", [*sr, "--out_dir", str(fifo)], what="--out_dir a FIFO")
    return cases


def _index_with_fake_embed(root: Path, meta: dict | None = None):
    import numpy as np

    from mlxio.search import build

    class Embed:
        def __call__(self, texts, progress=None):
            out = []
            for t in texts:
                rows = [np.random.default_rng(abs(hash(w)) % 2**32).standard_normal(16) for w in (t.split()[:8] or ["x"])]
                v = np.stack(rows).astype(np.float32)
                out.append((v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float16))
            return out

    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    for i in range(6):
        (src / f"mod{i}.py").write_text(f"def parse_date_{i}(text):\n    day, month = text.split('/')\n"
                                        f"    return int(day) + {i}\n\n\ndef other_{i}(x):\n    y = x * {i}\n    return y\n")
    meta = meta or {"model": "fake", "max_doc_len": 64, "max_query_len": 16, "dim": 16}
    build.update(src, root / "ix", Embed(), meta)
    return src, root / "ix", Embed(), meta


def run_record(cls: str, what: str, fn, timeout: float) -> dict:
    """The record of one case whose `fn() -> (outcome, detail)` judges itself, run under the
    per-case alarm with stderr captured (an exception escaping it is a traceback)."""
    err = io.StringIO()
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    start = time.perf_counter()
    try:
        with contextlib.redirect_stderr(err):
            outcome, detail = fn()
    except Hang:
        outcome, detail = "hang", "no result within the timeout"
    except BaseException as e:  # noqa: BLE001 - what the probe counts
        outcome, detail = "traceback", "".join(traceback.format_exception(e))[-600:]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    print(f"{outcome:9s} {cls:18s} {what[:70]!r}", file=sys.stderr)
    return {"class": cls, "what": what, "outcome": outcome, "detail": str(detail)[-400:],
            "s": round(time.perf_counter() - start, 2)}


def issue38_records(work: Path, timeout: float, skip: list[str] = ()) -> list[dict]:
    """Cases whose outcome needs more than an exit code: the worker, e.g., or a search index
    updated under readers. Each record's outcome is one of the probe's."""
    import threading

    w = work / "f38"
    w.mkdir()
    out: list[dict] = []

    def record(cls, what, fn):
        if not any(s in what for s in skip):
            out.append(run_record(cls, what, fn, timeout))

    def cli(prog, argv):
        kind, code, err, _ = run_in_process(PROGS.get(prog, prog), entry(prog), argv, timeout)
        last = err.rstrip("\n").splitlines()[-1] if err.strip() else ""
        return kind, last if kind in ("clear", "unclear") else err[-400:]

    # the worker: strict command line (real processes), bounded requests
    for argv in (["--log-level", "FOO"], ["--max-line-bytes", "5"], ["--max-line-bytes", "x"], ["--log"]):
        def worker_cli(argv=argv):
            proc = subprocess.run([sys.executable, "-m", "recipes.rlaif_worker", *argv], input=b"", capture_output=True,
                                  timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
            lines = proc.stderr.decode(errors="replace").strip().splitlines()
            if "Traceback" in proc.stderr.decode(errors="replace"):
                return "traceback", lines[-1] if lines else ""
            ok = proc.returncode == 2 and len(lines) == 1 and LINE.match(lines[0])
            return ("clear" if ok else "unclear" if proc.returncode else "silent"), (lines or [""])[-1]
        record("worker (38)", f"rlaif_worker {' '.join(argv)}", worker_cli)

    from mlxio import rpc
    from mlxio.run.config import to_dict
    from recipes.rlaif_config import PRESETS
    from recipes.rlaif_worker import make_worker

    worker = make_worker()
    server = worker.server()

    def call(method, **params):
        line = rpc.encode({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        return json.loads(server.handle_line(line.rstrip(b"\n")))

    call("initialize", preset="smoke", config={**to_dict(PRESETS["smoke"]), "out_dir": str(w / "worker")})
    for params in ({"prompts": ["a"], "n": 100000}, {"prompts": ["a"] * 3, "n": 2048},
                   {"prompts": ["a"], "n": 1, "max_tokens": 100000}, {"prompts": ["a"], "stop": ["x"] * 100},
                   {"prompts": ["a"] * 5000, "n": 1}):
        def bounded(params=params):
            answer = call("generate", **params)
            after = call("generate", prompts=["a"], n=1, max_tokens=2)
            if "error" not in answer:
                return "silent", "answered"
            ok = answer["error"]["code"] == rpc.INVALID_PARAMS and "result" in after
            return ("clear" if ok else "unclear"), answer["error"]["message"][:200]
        shown = {k: (f"[{len(v)} items]" if isinstance(v, list) else v) for k, v in params.items()}
        record("worker (38)", f"generate {shown}", bounded)

    # silent runs: every gradient norm infinite (a tiny loss temperature): no step counts as applied
    def tiny_temperature():
        kind, detail = cli("xtr_lora", ["--preset", "smoke", "--cache_dir", str(work / "cache"), "--out_dir",
                                        str(w / "x-temp"), "--loss.temperature", "1e-30", "--train.steps", "4",
                                        "--optim.total_steps", "4", "--optim.warmup_steps", "0"])
        exported = (w / "x-temp" / "merged").exists() or (w / "x-temp" / "eval.json").exists()
        return ("silent" if exported or kind == "silent" else kind), detail
    record("silent runs (38)", "--loss.temperature 1e-30 (xtr smoke, 4 steps)", tiny_temperature)

    def overflowing_norms():  # every gradient finite, their norm not: the update must count as skipped
        import mlx.core as mx

        from mlxcore.train import optim

        opt = optim.make_optimizer(optim.OptimConfig(lr=0.1, warmup_steps=0, total_steps=10))
        t = optim.skip_if_non_finite(optim.chain(optim.clip(1.0), optim.apply_optimizer(opt)))
        params = {"w": mx.ones((4,))}
        new, state, info = t.update({"w": mx.full((4,), 1e30)}, t.init(params), params, loss=mx.array(1.0))
        counted = int(info["skipped"]) == 1 and bool(mx.array_equal(new["w"], params["w"]))
        return ("handled" if counted else "silent"), f"skipped={int(info['skipped'])}"
    record("silent runs (38)", "gradient elements finite, their global norm overflows", overflowing_norms)

    # two runs into one out_dir at once: the second is refused (before: both wrote every metrics step)
    def two_runs():
        d = w / "shared"
        d.mkdir()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        first = subprocess.Popen([sys.executable, "-m", "recipes.rlaif_qwen", "--preset", "smoke", "--out_dir", str(d),
                                  "--eval.before", "false", "--eval.after", "false"], env=env, cwd=ROOT,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            t0 = time.perf_counter()
            while not (d / "config.json").exists() and first.poll() is None and time.perf_counter() - t0 < timeout / 2:
                time.sleep(0.2)
            return cli("rlaif_qwen", ["--preset", "smoke", "--out_dir", str(d), "--eval.before", "false",
                                      "--eval.after", "false", "--resume"])
        finally:
            first.kill()
            first.wait()
    record("out_dir (38)", "two runs into one out_dir at once", two_runs)

    # W&B that cannot start (online, no key)
    def wandb_online():
        try:
            import wandb  # noqa: F401
        except ImportError:
            return "handled", "wandb not installed: refused by --report_to's check"
        from mlxio.errors import user_error
        from mlxio.run.reporting import WandbWriter

        saved = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_API_KEY", "HOME")}
        os.environ.update(WANDB_MODE="online", HOME=str(w))
        os.environ.pop("WANDB_API_KEY", None)
        try:
            WandbWriter(w / "wb", "p", "n", {})
            return "silent", "started"
        except Exception as e:  # noqa: BLE001
            found = user_error(e)
            if found is None:
                return "traceback", repr(e)[:300]
            return ("clear" if LINE.match(f"xtr_lora: error: {found[0]}") else "unclear"), found[0]
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    record("run errors (38)", "--report_to wandb, WANDB_MODE=online, no API key", wandb_online)

    # a full disk during a checkpoint write (real 4 MiB tmpfs as root; else simulated ENOSPC)
    def checkpoint_disk_full():
        import mlx.core as mx

        from mlxio.errors import user_error
        from mlxio.run import checkpoint

        disk = w / "disk"
        disk.mkdir()
        real = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
                                                    capture_output=True).returncode == 0
        saved = mx.save_safetensors
        try:
            checkpoint.save(disk, 1, {"trainable": {"w": mx.ones((64, 64))}}, {})
            before = snapshot(disk / "checkpoints")
            if not real:
                def full(path, arrays, metadata=None):
                    saved(path, arrays, metadata=metadata)
                    raise OSError(28, "No space left on device", path)
                mx.save_safetensors = full
            try:
                checkpoint.save(disk, 2, {"trainable": {"w": mx.ones((1024, 1024))}, "opt": {"m": mx.ones((1024, 1024))}}, {})
                return "silent", "a checkpoint larger than the disk was written"
            except Exception as e:  # noqa: BLE001
                found = user_error(e)
                from mlxio.errors import MlxioError
                if snapshot(disk / "checkpoints") != before:
                    return "damaged", repr(e)[:200]
                if not isinstance(e, MlxioError):
                    return ("traceback" if found is None else "unclear"), repr(e)[:300]
                return ("clear" if "intact" in str(e) else "unclear"), str(e)
        finally:
            mx.save_safetensors = saved
            if real:
                subprocess.run(["umount", "-l", str(disk)], check=False)
    record("damage (38)", "disk full during a checkpoint write", checkpoint_disk_full)

    # odd files in an indexed / mined folder: skipped and counted, never read
    def odd_index():
        folder = _odd_folder(w / "odd-index")
        from mlxio.weights.encoders import default_encoder_path

        said_out = io.StringIO()
        kind, code, err, _ = run_in_process(PROGS["code_search"], entry("code_search"),
                                            ["index", str(folder), "--model", str(default_encoder_path()),
                                             "--index", str(w / "odd-ix"), "--no-progress"], timeout, said_out)
        if kind != "silent":  # exit 0 is right here
            return kind, err[-300:]
        text = said_out.getvalue()
        said = "not UTF-8" in text and "FIFO" in text and "character device" in text and "skipped 4" in text
        return ("handled" if said else "silent"), "skipped and named in the log" if said else "skipped without a word"
    record("odd source files (38)", "code_search index: a FIFO, /dev/zero and a dangling link named *.py, Latin-1 file",
           odd_index)

    def odd_mining():
        from mlxio.data import pairs

        corpus = pairs.mine_corpus([_odd_folder(w / "odd-mine")])
        counted = getattr(corpus.report, "not_regular", 0) == 3 and corpus.report.undecodable == 1
        return ("handled" if counted else "silent"), str(corpus.report)
    record("odd source files (38)", "mining a folder with a FIFO, /dev/zero link, Latin-1 file", odd_mining)

    # the search index
    def bm25_padding():
        from mlxio.search.index import Index

        _, idx, _, _ = _index_with_fake_embed(w / "bm25")
        hits = Index(idx).search("parse", None, "bm25", top_k=12)
        none = Index(idx).search("zebra", None, "bm25", top_k=5)
        zero = [s for _, s in hits if s <= 0] + [s for _, s in none]
        return ("silent" if zero else "handled"), f"{len(hits)} hits, {len(zero)} of score 0"
    record("search index (38)", "bm25 top-k with fewer matching documents than k", bm25_padding)

    def manifest_types():
        from mlxio.search import store

        results = []
        for field, value in (("dim", "16"), ("centroids", None), ("segments", "x"), ("search", {"nprobe": "8"}),
                             ("fusion", {"alpha": "0.5"}), ("max_query_len", 1.5), ("segments", [{"name": 3}])):
            root = w / f"mt-{len(results)}"
            _, idx, _, _ = _index_with_fake_embed(root)
            gen = store.current(idx)
            manifest = json.loads((gen / "manifest.json").read_text())
            manifest[field] = value
            (gen / "manifest.json").write_text(json.dumps(manifest))
            results.append(cli("code_search", ["search", "--index", str(idx), "--mode", "bm25", "parse"]))
        worst = next((r for r in results if r[0] != "clear"), results[0])
        return worst[0], f"{sum(r[0] == 'clear' for r in results)} of {len(results)} clear; {worst[1][:200]}"
    record("search index (38)", "manifest fields of the wrong type (7 kinds)", manifest_types)

    def readers_during_updates():
        from mlxio.search import build
        from mlxio.search.index import Index

        src, idx, embed, meta = _index_with_fake_embed(w / "readers")
        failures, loads, stop = [], [0], threading.Event()

        def read():
            while not stop.is_set():
                try:
                    Index(idx).search("parse", None, "bm25", top_k=3)
                    loads[0] += 1
                except Exception as e:  # noqa: BLE001
                    failures.append(repr(e)[:120])

        readers = [threading.Thread(target=read) for _ in range(2)]
        for r in readers:
            r.start()
        try:
            for i in range(40):
                (src / f"mod{i % 6}.py").write_text(f"def changed_{i}(x):\n    y = x + {i}\n    return y\n")
                build.update(src, idx, embed, meta)
        finally:
            stop.set()
            for r in readers:
                r.join()
        return ("handled" if not failures else "silent"), f"{loads[0]} loads during 40 updates, {len(failures)} failed" + (
            f": {failures[0]}" if failures else "")
    record("search index (38)", "searching during 40 updates (2 reader threads)", readers_during_updates)

    def two_writers():
        from mlxio.search import build

        src, idx, embed, meta = _index_with_fake_embed(w / "writers")
        (src / "new_a.py").write_text("def a_new(x):\n    y = x + 1\n    return y\n")
        reports, errors = [], []

        def write():
            try:
                reports.append(build.update(src, idx, embed, meta))
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e)[:200])
        threads = [threading.Thread(target=write) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            return "traceback", errors[0]
        rebuilt = [r for r in reports if r.rebuilt]
        return ("silent" if rebuilt else "handled"), f"embedded {[r.embedded for r in reports]}, rebuilt {len(rebuilt)}"
    record("search index (38)", "two writers updating one index at once", two_writers)

    def changed_model():
        import shutil

        import mlx.core as mx

        from mlxio.weights.encoders import default_encoder_path

        model = w / "model"
        model.mkdir()
        for f in default_encoder_path().iterdir():
            if f.is_file():
                shutil.copy(f, model / f.name)
        src = w / "cm-src"
        src.mkdir()
        (src / "a.py").write_text("def add(a, b):\n    '''Add two numbers.'''\n    total = a + b\n    return total\n")
        (src / "b.py").write_text("def read_lines(path):\n    with open(path) as h:\n        return h.read().split()\n")
        idx = w / "cm-ix"
        kind, _ = cli("code_search", ["index", str(src), "--model", str(model), "--index", str(idx), "--no-progress"])
        if kind != "silent":
            return kind, "first build failed"
        weights = mx.load(str(model / "model.safetensors"))
        mx.save_safetensors(str(model / "model.safetensors"), {k: v * 1.5 if v.ndim == 2 else v for k, v in weights.items()})
        return cli("code_search", ["search", "--index", str(idx), "--mode", "semantic", "add two numbers"])
    record("search index (38)", "search after new weights were saved at the model's path", changed_model)

    def changed_model_update():
        idx = w / "cm-ix"
        said = io.StringIO()
        kind, code, err, _ = run_in_process(PROGS["code_search"], entry("code_search"),
                                            ["index", str(w / "cm-src"), "--model", str(w / "model"), "--index", str(idx),
                                             "--no-progress"], timeout, said)
        if kind != "silent":
            return kind, err[-300:]
        text = said.getvalue()
        line = next((ln for ln in text.splitlines() if "rebuilt from scratch" in ln), "")
        return ("handled" if "model_digest" in line else "silent"), line[-200:] or text[-200:]
    record("search index (38)", "update after new weights at the model's path (must rebuild, naming why)",
           changed_model_update)

    # litter after a kill: a killed export's temp folder, swept at the next export
    def litter():
        from mlxio.atomic import atomic_dir

        d = w / "litter"
        d.mkdir()
        dead = 2**22 + 12345
        left = d / f".colbert.tmp-{dead}-deadbeef"
        left.mkdir()
        (left / "model.safetensors").write_bytes(b"half")
        with atomic_dir(d / "colbert") as tmp:
            (tmp / "x").write_text("1")
        return ("silent" if left.exists() else "handled"), "swept" if not left.exists() else "left behind"
    record("litter (38)", "a killed export's .colbert.tmp-* folder at the next export", litter)

    def litter_run_start():
        d = w / "litter-run"
        d.mkdir()
        left = d / f".merged.tmp-{2**22 + 54321}-0badf00d"
        left.mkdir()
        kind, detail = cli("xtr_lora", ["--preset", "smoke", "--cache_dir", str(work / "cache"), "--out_dir", str(d),
                                        "--model", str(w / "no-such-model")])  # fails after the run started
        return ("silent" if left.exists() else "handled"), f"{'left behind' if left.exists() else 'swept'}; {detail[:100]}"
    record("litter (38)", "a killed run's temp export folder at the next run's start", litter_run_start)
    return out


# ---------------------------------------------------------------- main

PROGS = {"code_search": "python -m recipes.code_search"}  # the name each entry point prints


def entry(prog: str):
    if prog == "xtr_lora":
        from recipes import xtr_lora
        return xtr_lora.main
    if prog == "rlaif_qwen":
        from recipes import rlaif_qwen
        return rlaif_qwen.main
    from recipes import code_search
    return code_search.main


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cpu/probe_bad_inputs.json")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per case")
    parser.add_argument("--subprocess-cases", type=int, default=12, help="cases also run as real processes")
    parser.add_argument("--skip", default="", help="comma-separated texts: cases whose description holds one are "
                                                   "not run (to measure older code without its unbounded cases)")
    parser.add_argument("--groups", default="config,path,data,code_search,faults,inputs38,faults38,rewards49,files49",
                        help="comma-separated case groups to run (all by default)")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="probe-") as tmp:
        work = Path(tmp)
        groups = set(args.groups.split(","))
        makers = {"config": config_cases, "path": path_cases, "data": data_cases, "code_search": code_search_cases,
                  "inputs38": issue38_cases}
        cases = [c for name, make in makers.items() if name in groups for c in make(work)]
        skip = [s for s in args.skip.split(",") if s]
        skipped = [c for c in cases if any(s in (c.get("what") or " ".join(c["argv"])) for s in skip)]
        cases = [c for c in cases if c not in skipped]
        results = []
        for case in cases:
            kept = {k: snapshot(v) for k, v in case.get("keep", {}).items()}
            kind, code, err, seconds = run_in_process(PROGS.get(case["prog"], case["prog"]), entry(case["prog"]),
                                                      case["argv"], args.timeout)
            if any(snapshot(v) != kept[k] for k, v in case.get("keep", {}).items()):
                kind = "damaged"
            last = err.rstrip("\n").splitlines()[-1] if err.strip() else ""
            results.append({"class": case["class"], "what": case.get("what") or " ".join(case["argv"])[:160],
                            "prog": case["prog"], "outcome": kind, "exit": code, "s": round(seconds, 2),
                            "detail": (last if kind in ("clear", "unclear") else err[-600:])[:600]})
            print(f"{kind:9s} {code} {case['prog']:10s} {results[-1]['what'][:80]!r}", file=sys.stderr)
        faults = fault_cases(work, args.timeout) if "faults" in groups else []
        faults += issue38_records(work, args.timeout, skip) if "faults38" in groups else []
        def record(cls, what, fn):
            if not any(s in what for s in skip):
                faults.append(run_record(cls, what, fn, args.timeout))

        def cli(prog, argv):
            kind, _, err, _ = run_in_process(PROGS.get(prog, prog), entry(prog), argv, args.timeout)
            last = err.rstrip("\n").splitlines()[-1] if err.strip() else ""
            return kind, last if kind in ("clear", "unclear") else err[-400:]
        if "rewards49" in groups:
            from dev.probe_rewards import reward_records

            reward_records(record, work, cli)
        if "files49" in groups:
            from dev.probe_run_folders import folder_records

            folder_records(record, work, cli, args.timeout)
        for r in faults:
            print(f"{r['outcome']:9s} {r['class']:10s} {r['what'][:80]!r}", file=sys.stderr)
        lenient = lenient_counts(work)
        sub = []
        step = max(1, len(cases) // max(args.subprocess_cases, 1))
        for case in cases[::step][: args.subprocess_cases]:
            if any("\x00" in a or "\ud800" in a for a in case["argv"]):
                continue  # argv cannot carry these through exec
            module = f"recipes.{case['prog']}"
            kind, code, err, seconds = run_subprocess(module, case["argv"], args.timeout)
            sub.append({"what": " ".join(case["argv"])[:160], "prog": case["prog"], "outcome": kind, "exit": code,
                        "s": round(seconds, 1), "detail": err.rstrip().splitlines()[-1][:300] if err.strip() else ""})
            print(f"{kind:9s} {code} subprocess {sub[-1]['what'][:80]!r}", file=sys.stderr)
    everything = results + faults
    counts = Counter(r["outcome"] for r in everything)
    by_class = {}
    for r in everything:
        by_class.setdefault(r["class"], Counter())[r["outcome"]] += 1
    report = {
        "tries": len(everything),
        "outcomes": dict(counts),
        "by_class": {k: dict(v) for k, v in sorted(by_class.items())},
        "exit_codes": dict(Counter(str(r.get("exit")) for r in results)),
        "lenient_data": lenient,
        "subprocess": {"tries": len(sub), "outcomes": dict(Counter(r["outcome"] for r in sub)), "cases": sub},
        "not_clear": [r for r in everything if r["outcome"] not in GOOD],
        "slowest_s": sorted((r["s"] for r in results), reverse=True)[:5],
        "wall_s": round(time.perf_counter() - started, 1),
        "skipped": [c.get("what") or " ".join(c["argv"])[:160] for c in skipped] + [f"faults38: {s}" for s in skip],
        "machine": os.uname().machine, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "examples": {k: next((r["detail"] for r in everything if r["class"] == k and r["outcome"] == "clear"), "")
                     for k in by_class},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=True) + "\n")
    print(json.dumps({k: report[k] for k in ("tries", "outcomes", "by_class", "wall_s")}, indent=1))
    return report


if __name__ == "__main__":
    main()
