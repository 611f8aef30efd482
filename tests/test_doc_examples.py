"""Examples that run as written: every shell command in README.md and docs/*.md is extracted from
the Markdown and has an entry in HOW, which says how this suite runs it:

- "parse": a recipe command's flags go through the recipe's own parser (`parse(argv)`): every
  option named, every value checked, as the command would at start-up (placeholders such as
  `path/to/repo` become real test paths);
- "run": run for real in a subprocess, at smoke size where the entry says so (flags appended,
  placeholders replaced by PLACES); the heavy ones are marked slow;
- "skip": changes the machine (installs, clones), needs what a test box lacks (a GPU, a second
  host, a server's network port), or is the suite itself; the reason is stated.

A command added to the docs without an entry fails `test_every_example_has_an_entry`."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)
# the quick preset as written took 12 min for 2 steps on the shared 2-core box (exit 0): CI runs
# the smoke preset's sizes on the same file and flags
SMOKE = ["--preset", "smoke"]


def commands(text: str) -> list[tuple[str, str]]:
    """[(command, its stdin)] of the bash blocks in `text`: continuation lines joined, comments
    and repeated spaces dropped, a heredoc's body and the JSON lines after a command (what a user types into it)
    taken as that command's input."""
    out: list[tuple[str, str]] = []
    for block in BLOCK.findall(text):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1] + " " + lines[i].strip()
            i += 1
            words = shlex.split(line, comments=True)
            if not words:
                continue
            if line.lstrip().startswith("{") and out:  # a line typed into the command above
                out[-1] = (out[-1][0], out[-1][1] + line.strip() + "\n")
                continue
            command = re.sub(r"\s+", " ", line.split(" #")[0]).strip()
            stdin = ""
            if "<<" in line:  # cat > FILE <<'EOF' ... EOF
                marker = line.split("<<", 1)[1].strip().strip("'\"")
                end = lines.index(marker, i)
                stdin, i = "\n".join(lines[i:end]) + "\n", end + 1
            out.append((command, stdin))
    return out


EXAMPLES = sorted({c for page in PAGES for c, _ in commands(page.read_text())})

GPU, HOST = "needs an NVIDIA GPU", "changes the machine (installs system or Python packages)"
HOSTS = "needs several hosts (or their GPUs)"
SERVE = "a server that runs until stopped (tests/recipes/test_code_search_mcp.py drives it)"
SERVER = "a teacher server on a network port (tests/mlxio/rl/test_teacher.py runs mlx-lm's server)"
HOW: dict[str, tuple] = {
    "git clone <this repository> && cd mlx-retrieval-rl": ("skip", "clones this repository: the suite runs in it"),
    "make install": ("skip", HOST),
    "make train": ("skip", "the full default recipe (~18 min on 2 cores); its smoke run is test_progress_lines"),
    "make test": ("skip", "the suite itself"),
    'pip install "nanobind>=3.0,<3.2" cmake': ("skip", HOST + "; " + GPU),
    "sudo apt-get install libfmt-dev": ("skip", HOST),
    "python -m mlxio.gpu.cuda_ext": ("skip", GPU + " (tests/mlxio/gpu/test_cuda_ext_build.py)"),
    # own pairs: the shipped example file, at smoke size
    "head -3 examples/pairs.jsonl": ("run", [], 60),
    'python -m recipes.xtr_lora --data.source examples/pairs.jsonl --data.packages "" --train.accum 2 '
    '--out_dir runs/mine':
        ("run", SMOKE, 1500, "slow"),
    'python -m recipes.xtr_lora --data.source path/to/src/ --data.packages ""': ("parse",),
    "python -m recipes.xtr_lora": ("parse",),
    "python -m recipes.xtr_lora --preset full": ("parse",),
    "python -m recipes.xtr_lora --model google/xtr-base-en": ("parse",),
    'python -m recipes.xtr_lora --data.source pairs.jsonl --data.packages ""': ("parse",),
    "python -m recipes.xtr_lora --resume": ("parse",),
    "python -m recipes.xtr_lora --help": ("run", [], 300),
    "python -m recipes.xtr_lora --preset smoke --resume": ("parse",),
    # code search on a small folder, with the embedded encoder for runs/xtr_lora/merged
    "python -m recipes.code_search index path/to/repo --model runs/xtr_lora/merged --index runs/idx": ("run", [], 600),
    'python -m recipes.code_search search --index runs/idx "parse a date string" --mode hybrid': ("run", [], 300),
    'python -m recipes.code_search search --index runs/idx "parse a date string"': ("run", [], 300),
    "python -m recipes.code_search search --index runs/idx --queries q.jsonl --output ranked.jsonl": ("run", [], 300),
    "python -m recipes.code_search verify --index runs/idx": ("run", [], 300),
    # RLAIF
    "python -m recipes.rlaif_qwen --model path/to/Qwen2.5-Coder-1.5B-Instruct --teacher.url http://127.0.0.1:8080/v1 "
    "--teacher.model default_model --teacher.timeout_s 120": ("parse",),
    "python -m recipes.rlaif_qwen --data.source humaneval": ("parse",),
    "python -m recipes.rlaif_qwen": ("parse",),
    "python -m recipes.rlaif_qwen --preset gpu": ("parse",),
    "python -m recipes.rlaif_qwen --model path/to/Qwen2.5-Coder-1.5B-Instruct": ("parse",),
    "python -m recipes.rlaif_qwen --teacher.url http://127.0.0.1:8080/v1 --teacher.model default_model": ("parse",),
    "python -m recipes.rlaif_qwen --resume": ("parse",),
    "python -m recipes.rlaif_qwen --help": ("run", [], 300),
    "python -m recipes.rlaif_qwen --teacher.url http://127.0.0.1:8080/v1 --teacher.model default_model "
    "--teacher.scoring verdict --teacher.timeout_s 120 --teacher.retries 2": ("parse",),
    "python -m recipes.rlaif_qwen --teacher.url http://127.0.0.1:8080/v1 --teacher.scoring verdict "
    "--rewards.execution 0": ("parse",),
    "python -m recipes.rlaif_worker": ("run", [], 600, "slow"),
    "python -m recipes.rlaif_judge": ("parse",),
    "python -m recipes.rlaif_judge --data.logs runs/rlaif_quick": ("parse",),
    "python -m mlxio.weights.import_gguf --default runs/teacher-smollm2 --dequantize --dtype float32":
        ("run", [], 600, "slow"),
    "python -m mlxio.weights.import_gguf --default runs/judge-base --dequantize --dtype float32":
        ("skip", "the same command as runs/teacher-smollm2's, another folder"),
    "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 python -m mlx_lm server "
    "--model runs/teacher-smollm2 --host 127.0.0.1 --port 8080 &": ("skip", SERVER),
    "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 python -m mlx_lm server "
    "--model runs/judge-base --adapter-path runs/rlaif_judge/adapters --port 8080 &": ("skip", SERVER),
    # distributed: two ranks of a recipe (tests/mlxio/run/test_distributed.py runs mlx.launch)
    "mlx.launch -n 2 --backend ring -- python -m recipes.xtr_lora --preset smoke": ("skip", "two ranks on a shared 2-core box"),
    "mlx.launch -n 2 --backend ring -- python -m recipes.rlaif_qwen --preset smoke": ("skip", "two ranks on a shared 2-core box"),
    "mlx.launch -n 2 --backend ring -- python -m recipes.xtr_lora --preset smoke --stop_after 4":
        ("skip", "two ranks on a shared 2-core box"),
    "python -m benchmarks.rlaif_arms --work /tmp/arms --deadline_s 530": ("skip", GPU),
    "python -m benchmarks.rlaif_arms --work /tmp/arms --summarize --machine h200": ("skip", "reads a GPU run's work folder"),
    "python -m benchmarks.rlaif_arms --work /tmp/rh --rehearse --seeds 0": ("skip", "a rehearsal of a GPU sitting (minutes)"),
    "mlx.launch --backend mpi --hostfile hosts.json --env OPENBLAS_NUM_THREADS=16 -- python -m recipes.xtr_lora "
    "--preset full --out_dir runs/xtr_mpi": ("skip", HOSTS),
    "mlx.launch --backend nccl --hosts 10.0.0.1,10.0.0.2 --repeat-hosts 8 --nccl-port 29500 --env "
    "NCCL_SOCKET_IFNAME=eth0 -- python -m recipes.xtr_lora --preset full --out_dir runs/xtr_16gpu": ("skip", HOSTS),
    "mlx.launch --backend nccl -n 2 -- python -m recipes.xtr_lora --preset full": ("skip", GPU),
    "mlx.launch --backend nccl -n 8 -- python -m recipes.rlaif_qwen --preset full --model "
    "path/to/Qwen2.5-Coder-1.5B-Instruct": ("skip", GPU),
    "mlx.launch --hostfile hosts.json --backend ring -- python -m recipes.xtr_lora --preset full --out_dir runs/xtr_full":
        ("skip", HOSTS),
    "mpirun -np 4 --hostfile ompi_hosts -x OPENBLAS_NUM_THREADS=16 python -m recipes.rlaif_qwen --preset quick "
    "--out_dir runs/rlaif_mpi": ("skip", HOSTS),
    "python -m pytest tests/mlxio/run/test_distributed.py -q": ("skip", "part of this suite"),
    'python -m pytest tests/mlxio/run/test_distributed.py -q -m "not slow"': ("skip", "part of this suite"),
    "python -m pytest tests/recipes/test_multihost.py -q -s": ("skip", "part of this suite"),
    "python -m recipes.code_search serve --index runs/idx": ("skip", SERVE),
    "python -m recipes.code_search serve --index runs/idx --transport http --port 8765": ("skip", SERVE),
    "python -m recipes.code_search serve --index runs/idx --watch path/to/repo": ("skip", SERVE),
    "python -m recipes.code_search serve --index runs/idx --watch path/to/repo --model runs/xtr_lora/merged":
        ("skip", SERVE),

}


def test_every_example_has_an_entry():
    missing = [c for c in EXAMPLES if c not in HOW]
    assert not missing, f"shell examples in the docs without an entry in HOW: {missing}"
    stale = [k for k in HOW if k not in EXAMPLES]
    assert not stale, f"HOW entries no page shows any more: {stale}"


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """What the placeholders become: a small repository, the embedded encoder for a trained
    model, a queries file (and the working folder, "cwd")."""
    from mlxio.weights.encoders import default_encoder_path

    root = tmp_path_factory.mktemp("examples")
    repo = root / "repo"
    repo.mkdir()
    (repo / "dates.py").write_text('def parse_date(s):\n    """Parse an ISO date string."""\n    return s.split("-")\n')
    (repo / "files.py").write_text('def read_text(path):\n    """Read a whole file as text."""\n'
                                   "    with open(path) as f:\n        return f.read()\n")
    (root / "q.jsonl").write_text(json.dumps({"id": 1, "query": "parse a date"}) + "\n")
    return {"path/to/repo": str(repo), "path/to/src/": str(repo) + "/", "runs/xtr_lora/merged": str(default_encoder_path()), "cwd": root}


def substituted(command: str, places: dict) -> list[str]:
    words = shlex.split(command)
    return [places.get(w) or w for w in words]


PARSE = [c for c in EXAMPLES if HOW.get(c, ("",))[0] == "parse"]


@pytest.mark.parametrize("command", PARSE)
def test_recipe_flags_parse_as_written(command, places, monkeypatch):
    import importlib

    words = substituted(command, places)
    assert words[:3] == ["python", "-m", words[2]] and words[2].startswith("recipes.")
    module = importlib.import_module(words[2])
    monkeypatch.chdir(places["cwd"])
    cfg, _ = module.parse(words[3:])
    assert cfg is not None


RUN = [pytest.param(c, marks=[pytest.mark.slow] if "slow" in HOW[c] else [], id=c)
       for c in EXAMPLES if HOW.get(c, ("",))[0] == "run"]


@pytest.mark.parametrize("command", RUN)
def test_example_runs(command, places):
    """Runs in one working folder per module (the index the search examples read is the one the
    index example built); exit status 0."""
    _, extra, timeout = HOW[command][:3]
    words = substituted(command, places) + list(extra)
    cwd = places["cwd"]
    if words[:3] == ["python", "-m", "recipes.code_search"] and words[3] != "index" and not (cwd / "runs/idx").exists():
        subprocess.run([sys.executable, "-m", "recipes.code_search", "index", places["path/to/repo"], "--model",
                        places["runs/xtr_lora/merged"], "--index", "runs/idx", "--no-progress"], cwd=cwd, check=True,
                       capture_output=True, timeout=600)
    if words[0] == "python":
        words[0] = sys.executable
    if words[0] == "head":  # a file of this repository
        words[-1] = str(ROOT / words[-1])
    if "examples/pairs.jsonl" in words:
        words[words.index("examples/pairs.jsonl")] = str(ROOT / "examples/pairs.jsonl")
    stdin = dict((c, s) for page in PAGES for c, s in commands(page.read_text())).get(command, "")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(words, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stderr[-3000:]}"
    if words[2:4] == ["recipes.code_search", "search"] and "--queries" not in words:
        assert "parse" in done.stdout  # the date function is found
    if command.startswith("python -m recipes.rlaif_worker"):
        replies = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert [r.get("id") for r in replies] == [1, 2] and all("result" in r for r in replies), done.stdout[-2000:]
