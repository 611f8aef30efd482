"""Both recipes across two "hosts": `mlx.launch --hostfile` with two entries on different
loopback addresses (127.0.0.1 and 127.0.0.2), ring backend, each rank its own process as on
two machines. The retriever's smoke run on 2 hosts trains the same LoRA weights as on 1 rank;
RLAIF samples with per-rank seeds (rank-hashed), so its 2-host run is compared with the same
2 ranks started on one host (`-n 2`): the topology changes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlxio.run import checkpoint

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-4  # float32 reduction order differs between 1 x m and 2 x m/2 (as in test_distributed)


def _free_port_run(n: int) -> int:
    import socket

    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + n > 65535:
            continue
        try:
            for i in range(1, n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + i))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port range")


def _run(cmd: list[str], timeout: float = 600) -> str:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, start_new_session=True,
                            env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{cmd} timed out after {timeout} s:\n{out[-4000:]}")
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def _launch(hosts: list[str] | None, args: list[str], tmp: Path) -> str:
    """`mlx.launch` of `python args`: on `hosts` (a hostfile, one rank per address) or, with
    None, 2 ranks on this host (-n 2)."""
    launcher = str(Path(sys.executable).with_name("mlx.launch"))
    port = str(_free_port_run(2))
    if hosts is None:
        where = ["-n", "2"]
    else:
        hostfile = tmp / "hosts.json"
        # "ssh": 127.0.0.1 makes mlx.launch start the rank here, without ssh; "ips" is the
        # address the ring connects to, a different one per "host"
        hostfile.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": [ip]} for ip in hosts]))
        where = ["--hostfile", str(hostfile)]
    return _run([launcher, *where, "--backend", "ring", "--starting-port", port, "--",
                 sys.executable, *args])


def _lora(out: Path) -> dict[str, np.ndarray]:
    _path, trees, meta = checkpoint.load_latest(out)
    flat = {}

    def walk(node, prefix=""):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        elif isinstance(node, list | tuple):
            for i, v in enumerate(node):
                walk(v, f"{prefix}.{i}")
        elif hasattr(node, "shape"):
            flat[prefix] = np.array(node)

    walk(trees)
    return {k: v for k, v in flat.items() if "lora" in k}


def _max_diff(a: dict, b: dict) -> float:
    assert a and sorted(a) == sorted(b)
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


@pytest.mark.slow  # 3 retriever + 2 x 2 RLAIF smoke runs: ~3 min on 2 idle cores
def test_two_hosts_over_loopback(tmp_path):
    hosts = ["127.0.0.1", "127.0.0.2"]
    # retriever: 2 hosts == 1 rank
    one, two = tmp_path / "xtr1", tmp_path / "xtr2"
    _run([sys.executable, "-m", "recipes.xtr_lora", "--preset", "smoke", "--out_dir", str(one)])
    _launch(hosts, ["-m", "recipes.xtr_lora", "--preset", "smoke", "--out_dir", str(two)], tmp_path)
    diff = _max_diff(_lora(one), _lora(two))
    print(f"retriever smoke: max |LoRA(2 hosts) - LoRA(1 rank)| = {diff:.2e}")
    assert diff < TOLERANCE
    assert max(float(np.abs(v).max()) for k, v in _lora(two).items() if "lora_b" in k) > 0  # it trained
    # RLAIF: 2 hosts == 2 ranks on one host (sampling seeds are per rank)
    local, remote = tmp_path / "rl_local", tmp_path / "rl_hosts"
    _launch(None, ["-m", "recipes.rlaif_qwen", "--preset", "smoke", "--out_dir", str(local)], tmp_path)
    _launch(hosts, ["-m", "recipes.rlaif_qwen", "--preset", "smoke", "--out_dir", str(remote)], tmp_path)
    assert _max_diff(_lora(local), _lora(remote)) == 0.0
    a = [json.loads(x) for x in (local / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (remote / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in a] == [r["loss"] for r in b] and len(a) == 4
