"""Data-parallel training on mx.distributed (mlxio.run.distributed).

The launched tests start real ranks with `mlx.launch -n 2 --backend ring` on this CPU (free
ports picked per launch; the whole process group is killed on timeout), and compare with the
same code run here on one rank:
- 2 ranks x micro-batch 6 == 1 rank x micro-batch 12 after 5 optimizer steps (LoRA weights and
  losses), for the retriever recipe's loss/step (gathered in-batch negatives, MaxSim and XTR
  top-k scores) and for the RLAIF recipe's loss/batch/step (group advantages computed globally,
  a group straddling the ranks, a missing reward) with each loss type and GRPO control (loss
  normalisers over every rank's rows; its logged metrics too);
- MLX's own `all_gather` VJP in place of `gather_rows` does NOT give that equality;
- broadcast / replication checks / gathers behave on real ranks (tests/dist/collectives.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxio.errors import ConfigError
from mlxio.run import distributed

ROOT = Path(__file__).resolve().parents[3]
DIST = ROOT / "tests" / "dist"
TOLERANCE = 1e-4  # float32 reduction order differs between 1 x 12 and 2 x 6; measured ~3e-6 (bnpo 9e-6)
RLAIF_MODES = ("rlaif", "rlaif_dr_grpo", "rlaif_dapo", "rlaif_bnpo")  # dp_equivalence.RLAIF_OPTIONS


def free_port_pair() -> int:
    """A port p with p and p + 1 free (the ring backend listens on one port per rank)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def launch(*python_args: str, ranks: int = 2, timeout: float = 240) -> str:
    """Run `mlx.launch -n ranks --backend ring -- python *python_args` from the repo root; its
    output. Fails the test (after killing every process it started) on a non-zero exit or a
    timeout."""
    launcher = Path(sys.executable).with_name("mlx.launch")
    cmd = [str(launcher), "-n", str(ranks), "--backend", "ring", "--starting-port",
           str(free_port_pair()), "--", sys.executable, *python_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{python_args} timed out after {timeout} s:\n{out[-4000:]}")
    assert proc.returncode == 0, f"{python_args} exited {proc.returncode}:\n{out[-4000:]}"
    return out


@pytest.fixture(scope="module")
def worker():
    spec = importlib.util.spec_from_file_location("dp_equivalence", DIST / "dp_equivalence.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every mode's result on 2 ranks, from one launch (process start-up is the slow part)."""
    out = tmp_path_factory.mktemp("dp")
    modes = ("xtr", "xtr_topk", *RLAIF_MODES, "xtr_mlx_vjp")
    launch(str(DIST / "dp_equivalence.py"), str(out), *modes)
    return {m: dict(np.load(out / f"{m}.npz")) for m in modes}


def lora_diff(a: dict, b: dict) -> float:
    keys = [k for k in a if "lora" in k]
    assert keys and sorted(keys) == sorted(k for k in b if "lora" in k)
    return max(float(np.abs(a[k] - b[k]).max()) for k in keys)


@pytest.mark.slow  # two launched ranks importing mlx-lm: ~60 s on 2 idle cores
@pytest.mark.parametrize("mode", ["xtr", "xtr_topk", *RLAIF_MODES])
def test_two_ranks_of_6_equal_one_rank_of_12(worker, two_ranks, mode):
    """RLAIF: with a missing reward on rank 0 only, a per-rank normaliser (5 vs 6 sequences)
    drifted the LoRA weights by 0.10 (grpo); normalisers over every rank's rows: ~1e-6."""
    one = worker.run(mode, distributed.SINGLE)
    two = two_ranks[mode]
    assert int(two["world_size"]) == 2
    assert any(np.abs(v).max() > 1e-3 for k, v in one.items() if k.endswith("lora_b"))  # it trained
    diff = lora_diff(one, two)
    print(f"{mode}: max |LoRA(2 x 6) - LoRA(1 x 12)| = {diff:.2e}")
    assert diff < TOLERANCE
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5, atol=1e-6)
    metrics = sorted(k for k in one if k.startswith("metric/"))
    assert sorted(k for k in two if k.startswith("metric/")) == metrics
    for name in metrics:  # kl, entropy, clip_frac, token_entropy, grad_norm, ...: global on both
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_mlx_all_gather_vjp_alone_would_not_match(worker, two_ranks):
    """Without the cross-rank backward of `gather_rows`, each rank's documents miss the
    gradient the other rank's queries send them: the weights drift far beyond tolerance."""
    one = worker.run("xtr", distributed.SINGLE)
    assert lora_diff(one, two_ranks["xtr_mlx_vjp"]) > 100 * TOLERANCE


def test_collectives_on_two_ranks(tmp_path):
    launch(str(DIST / "collectives.py"), str(tmp_path / "seen.json"))
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["size"] == 2 and seen["reduced_grad"] == 1.5 and seen["rank_mean"] == 2.5
    assert "differs from rank 0" in seen["broadcast_tree_mismatch"]
    assert "rank(s) [1]" in seen["replicated_mismatch"]


# --------------------------------------------------------------------- one process, no launcher


def test_unlaunched_process_is_a_single_rank():
    world = distributed.init()
    assert (world.rank, world.size, world.is_main) == (0, 1, True)
    assert distributed.grad_reducer(world) is None and distributed.rank_mean(world) is None

    def loss(p, b, k):
        return p, {}

    assert distributed.data_parallel_loss(loss, world) is loss
    assert distributed.rank_seed(7, world) == 7
    assert distributed.broadcast_json({"a": 1}, world) == {"a": 1}


@given(ranks=st.integers(1, 4), per_rank=st.integers(1, 3), accum=st.integers(1, 3))
def test_shards_partition_the_global_batch(ranks, per_rank, accum):
    micro = ranks * per_rank
    batch = {"ids": np.arange(accum * micro * 5).reshape(accum, micro, 5),
             "mask": np.ones((accum, micro, 5), np.int32)}
    shards = [distributed.shard_rows(batch, distributed.World(rank=r, size=ranks)) for r in range(ranks)]
    for name in batch:
        assert all(s[name].shape == (accum, per_rank, 5) for s in shards)
        np.testing.assert_array_equal(np.concatenate([s[name] for s in shards], axis=1), batch[name])


def test_indivisible_micro_batch_is_a_config_error():
    world = distributed.World(rank=0, size=4)
    with pytest.raises(ConfigError, match=r"train.micro_batch=6 must be divisible by the number of ranks \(4\)"):
        distributed.local_size(6, world, "train.micro_batch")
    with pytest.raises(ConfigError, match="ids rows"):
        distributed.shard_rows({"ids": np.zeros((1, 6, 3))}, world)


def test_sharded_positions_stay_global():
    batches = [(i, {"x": np.arange(8).reshape(1, 8) + 10 * i}) for i in range(3)]
    got = list(distributed.shard_batches(batches, distributed.World(rank=1, size=2)))
    assert [p for p, _ in got] == [0, 1, 2]
    np.testing.assert_array_equal(got[2][1]["x"], [[24, 25, 26, 27]])


# --------------------------------------------------------------------- the retriever recipe


@pytest.mark.slow  # three runs of the smoke preset on the real MiniLM (~1-2 min on 2 cores)
def test_xtr_recipe_resumes_on_another_rank_count(tmp_path):
    """Steps 1-2 on one process, 3-4 on two launched ranks == steps 1-4 on one process; rank 0
    alone writes (one metrics line per step, one checkpoint per save)."""
    from mlxcore.train.tree import flatten
    from mlxio.run import checkpoint
    from recipes import xtr_lora

    args = ["--preset", "smoke", "--cache_dir", str(tmp_path / "cache"), "--export", "false"]
    assert xtr_lora.main([*args, "--out_dir", str(tmp_path / "one"), "--stop_after", "4"]) == {"stopped_at": 4}
    split = tmp_path / "split"
    assert xtr_lora.main([*args, "--out_dir", str(split), "--stop_after", "2"]) == {"stopped_at": 2}
    launch("-m", "recipes.xtr_lora", *args, "--out_dir", str(split), "--stop_after", "4", "--resume",
           timeout=420)
    steps = [json.loads(line)["step"] for line in (split / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert sorted(p.name for p in (split / "checkpoints").glob("step-*")) == ["step-00000002", "step-00000004"]
    (one, _), (two, meta) = [checkpoint.load_latest(d)[1:] for d in (tmp_path / "one", split)]
    assert meta["step"] == 4 and meta["data_position"] == checkpoint.load_latest(tmp_path / "one")[2]["data_position"]
    a, b = flatten(one["trainable"]), flatten(two["trainable"])
    diff = max(float(np.abs(np.array(a[k]) - np.array(b[k])).max()) for k in a)
    print(f"xtr smoke: max |LoRA(1 rank, 2 ranks) - LoRA(1 rank)| after 4 steps = {diff:.2e}")
    assert diff < TOLERANCE


# --------------------------------------------------------------------- the RLAIF recipe


def test_rlaif_rank_share_splits_prompts_or_groups():
    from mlxio.rl import grpo

    shares = [grpo.rank_share(4, 6, 2, distributed.World(rank=r, size=2)) for r in range(2)]
    assert shares == [(slice(0, 2), 6), (slice(2, 4), 6)]  # whole prompts per rank
    assert grpo.rank_share(3, 4, 2, distributed.World(rank=1, size=2)) == (slice(0, 3), 2)  # groups split
    with pytest.raises(ConfigError, match="3 ranks must divide prompts_per_step=4 or group_size=8"):
        grpo.rank_share(4, 8, 1, distributed.World(size=3))
    with pytest.raises(ConfigError, match="train.accum=4 must divide each rank's 6 completions"):
        grpo.rank_share(3, 4, 4, distributed.World(size=2))


def test_rlaif_batch_drops_empty_micro_batches_on_one_rank_only():
    from mlxcore.rl.policy import GrpoConfig
    from mlxio.rl import grpo

    with pytest.raises(ValueError, match="drop_empty: one process only"):
        grpo.build_batch(None, None, {}, np.zeros(2), np.ones(2, bool), accum=1, max_new_tokens=8, beta=0.0,
                         clip_eps=None, grpo=GrpoConfig(), logprob_chunk=8, drop_empty=True,
                         world=distributed.World(rank=0, size=2))


@pytest.mark.slow  # two launched ranks of the smoke preset (tiny llama, sandboxed rewards)
def test_rlaif_recipe_on_two_ranks_writes_once_and_resumes_on_one(tmp_path):
    out = tmp_path / "rlaif"
    args = ["--preset", "smoke", "--out_dir", str(out), "--eval.before", "false", "--eval.after", "false"]
    launch("-m", "recipes.rlaif_qwen", *args, "--stop_after", "2", timeout=420)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    # 2 prompts x 4 samples x <= 12 new tokens, generated half on each rank, counted once
    assert all(0 < r["completion_tokens"] <= 96 and np.isfinite(r["loss"]) for r in records)
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-00000002"]
    from recipes import rlaif_qwen as rq

    rq.main([*args, "--resume"])  # one process finishes what two ranks started
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert (out / "adapters").is_dir() and (out / "eval.json").is_file()
