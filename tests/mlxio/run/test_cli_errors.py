"""The error contract of every entry point, through a real process: a user error prints exactly
one line `<prog>: error: <what> (<where>); <how to fix>` on stderr (no traceback) and exits 2
(usage / config) or 1 (runtime); a real bug still shows its traceback."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlxio.errors import ConfigError, DataError, DiskError, cli_main
from mlxio.weights.encoders import default_encoder_path

ROOT = Path(__file__).resolve().parents[3]
LINE = re.compile(r"^(xtr_lora|rlaif_qwen|python -m recipes.code_search): error: [^\n]+ \([^\n]+\); [^\n]+\n$")


def run(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLXIO_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def stderr_line(proc) -> str:
    """The last line of stderr (logging lines may come before it), checked against the contract."""
    lines = proc.stderr.splitlines(keepends=True)
    assert lines, "nothing on stderr"
    assert "Traceback" not in proc.stderr, proc.stderr
    assert LINE.match(lines[-1]), lines[-1]
    return lines[-1]


@pytest.fixture(scope="module")
def no_tokenizer_model(tmp_path_factory):
    src = default_encoder_path()
    model = tmp_path_factory.mktemp("notok")
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(src / name, model / name)
    return model


def test_cases_of_the_issue(tmp_path, no_tokenizer_model):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    bad_config = tmp_path / "bad.json"
    bad_config.write_text('{"export": "false", "lora": {"targets": "query"}}')
    llm_dir = tmp_path / "llm"
    llm_dir.mkdir()
    (llm_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    cases = [  # argv, exit code, text the line must hold
        (["recipes.rlaif_qwen", "--model", "/nonexistent", "--out_dir", str(tmp_path / "r")], 1, "/nonexistent"),
        (["recipes.xtr_lora", "--train.checkpoint_every", "0"], 2, "train.checkpoint_every: must be >= 1, got 0"),
        (["recipes.xtr_lora", "--out_dir", str(a_file)], 2, "is a file, not a directory"),
        (["recipes.rlaif_qwen", "--optim.lr", "-1"], 2, "optim.lr: must be > 0"),
        (["recipes.rlaif_qwen", "--optim.l", "1e-4"], 2, "unrecognized arguments: --optim.l"),
        (["recipes.xtr_lora", "--loss.temperature", "0"], 2, "loss.temperature: must be >= 0.0001"),
        (["recipes.xtr_lora", "--config", str(bad_config)], 2, "export: expected true or false"),
        (["recipes.xtr_lora", "--model", str(no_tokenizer_model), "--preset", "smoke", "--out_dir",
          str(tmp_path / "x"), "--cache_dir", str(tmp_path / "cache")], 1, "no tokenizer files"),
        (["recipes.rlaif_qwen", "--model", str(llm_dir), "--out_dir", str(tmp_path / "r2")], 1, "no tokenizer files"),
        (["recipes.code_search", "search", "--index", str(tmp_path / "none"), "a query"], 1, "no search index"),
    ]
    for argv, code, text in cases:
        proc = run(*argv)
        assert proc.returncode == code, (argv, proc.returncode, proc.stderr[-2000:])
        assert text in stderr_line(proc), (argv, proc.stderr[-2000:])
    assert a_file.read_text() == "x"


def test_contract_in_process(capsys, tmp_path):
    def raises(err):
        def fn(argv):
            raise err
        return fn

    full = tmp_path / "out" / "model.safetensors"
    for err, code, text in [
        (ConfigError("steps: must be >= 1, got 0", where="command line", fix="set --steps"), 2, "steps: must be"),
        (DataError("f.jsonl:3: field 'query': empty string"), 1, "f.jsonl:3"),
        (DiskError("writing the merged model failed", where=str(full)), 1, "merged model"),
        (OSError(28, "No space left on device", str(full)), 1, "disk full"),
        (OSError(30, "Read-only file system", str(full)), 1, "read-only"),
        (PermissionError(13, "Permission denied", str(full)), 1, "permission denied"),
        (ConnectionRefusedError(111, "Connection refused"), 1, "network"),
        (SystemExit("stopped: 3 steps were non-finite"), 1, "non-finite"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            cli_main("demo", raises(err), [])
        out = capsys.readouterr().err
        assert exit_info.value.code == code, (err, out)
        assert out.startswith("demo: error: ") and out.count("\n") == 1 and text in out, out
    with pytest.raises(SystemExit) as exit_info:
        cli_main("demo", lambda argv: None, [])
    assert exit_info.value.code == 0


def test_a_real_bug_keeps_its_traceback():
    with pytest.raises(ZeroDivisionError):
        cli_main("demo", lambda argv: 1 / 0, [])
    with pytest.raises(KeyError):
        cli_main("demo", lambda argv: {}["x"], [])
