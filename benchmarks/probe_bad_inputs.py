"""Probe: run a few hundred bad inputs and faults through every entry point and count what
happens. Writes benchmarks/results/cpu/probe_bad_inputs.json.

    python -m benchmarks.probe_bad_inputs [--out FILE] [--subprocess-cases 12] [--timeout 60]

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
Sandbox cases count `contained` (the quota held) or `escaped`. The probe fails fast on
purpose: only a few cases train (the RLAIF smoke preset, a tiny random model, seconds).
"""

from __future__ import annotations

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
LINE = re.compile(r"^(xtr_lora|rlaif_qwen|python -m recipes.code_search): error: [^\n]+ \([^\n]*\); [^\n]+$")


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


def run_in_process(prog: str, fn, argv: list[str], timeout: float) -> tuple[str, int | None, str, float]:
    from mlxio.errors import cli_main

    err = io.StringIO()
    code, exc = None, None
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            cli_main(prog, fn, argv)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException as e:  # noqa: BLE001 - what the probe counts
        exc = e
        err.write("".join(traceback.format_exception(e)))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
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
    from recipes import rlaif_config, xtr_lora

    cases = []
    for prog, cls in (("xtr_lora", xtr_lora.Config), ("rlaif_qwen", rlaif_config.Config)):
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
                                                "entry_point": f"f{i}", "test": "def check(c):\n    pass\n"}).encode()
                                    for i in range(12)) + b"\n")
    run_dir = work / "nonfinite"
    base = rq.PRESETS["smoke"]
    cfg = attrs.evolve(base, out_dir=str(run_dir), train=attrs.evolve(base.train, max_consecutive_skips=10),
                       data=attrs.evolve(base.data, problems=str(problems), heldout_fraction=0.4),
                       eval=attrs.evolve(base.eval, before=False, after=False))
    kind, code, err, _ = run_in_process("rlaif_qwen", lambda argv: rq.run(cfg, extra_rewards=[(Huge(), 1.0)]),
                                        [], timeout)
    exported = (run_dir / "adapters").exists() or (run_dir / "fused").exists()
    record("silent run", "every update non-finite (RLAIF smoke, rewards overflow)",
           "silent" if exported or kind == "silent" else kind, err)

    # the retriever recipe: every loss NaN for fewer steps than the consecutive-skip limit
    from mlxcore import retriever
    from recipes import xtr_lora

    real_loss = retriever.contrastive_loss_fn

    def poisoned(*a):
        loss_fn = real_loss(*a)

        def nan_loss(params, batch, key):
            loss, aux = loss_fn(params, batch, key)
            return loss * float("nan"), aux
        return nan_loss

    retriever.contrastive_loss_fn = poisoned
    try:
        run_dir = work / "xtr_nonfinite"
        kind, code, err, _ = run_in_process("xtr_lora", xtr_lora.main, [
            "--preset", "smoke", "--cache_dir", str(work / "cache"), "--out_dir", str(run_dir), "--train.steps", "3",
            "--optim.total_steps", "3", "--train.max_consecutive_skips", "10"], timeout)
    finally:
        retriever.contrastive_loss_fn = real_loss
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

    from mlxcore import lora
    from mlxcore.lora import LoraConfig
    from mlxcore.tree import combine
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
    from mlxio import sandbox
    from mlxio.sandbox import SandboxError, SandboxLimits, require_isolation, run_check

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
    if sandbox.sandbox_backend() == "bwrap":
        v = run_check(fill, test.replace("WHERE", "'/tmp'"), "fill", limits)
        records.append({"class": "sandbox", "what": "fill 64 MiB of /tmp under an 8 MiB quota (bwrap)",
                        "outcome": "escaped" if v.status == "passed" else "contained", "detail": v.status})
        v = run_check(hog, "def check(c):\n    assert c() == 4\n", "hog", limits)
        records.append({"class": "sandbox", "what": "4 processes x 150 MiB under a 256 MiB bound (bwrap)",
                        "outcome": "escaped" if v.status == "passed" else "contained", "detail": v.status})
    real_backend = sandbox.sandbox_backend
    try:
        sandbox.sandbox_backend = lambda: "none"
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
        sandbox.sandbox_backend = real_backend
    return records


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
    parser.add_argument("--groups", default="config,path,data,code_search,faults",
                        help="comma-separated case groups to run (all by default)")
    args = parser.parse_args(argv)
    import mlxio  # noqa: F401  (fast BLAS first)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="probe-") as tmp:
        work = Path(tmp)
        groups = set(args.groups.split(","))
        makers = {"config": config_cases, "path": path_cases, "data": data_cases, "code_search": code_search_cases}
        cases = [c for name, make in makers.items() if name in groups for c in make(work)]
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
        "not_clear": [r for r in everything if r["outcome"] not in ("clear", "contained")],
        "slowest_s": sorted((r["s"] for r in results), reverse=True)[:5],
        "wall_s": round(time.perf_counter() - started, 1),
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
