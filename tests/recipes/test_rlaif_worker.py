"""The RLAIF worker (recipes.rlaif_worker, mlxio.rl.worker, mlxio.rpc): the recipe's numerics
through the protocol, checkpoints and exact resume, and robustness of the stdio server."""

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest
from lock_holder import holding
from mlx.utils import tree_flatten

from mlxio import rpc
from mlxio.rl import grpo
from mlxio.rl.evaluation import EvalConfig, instruction, load_problems
from mlxio.rl.rewards import RewardConfig
from mlxio.rl.worker_protocol import PROTOCOL_VERSION, SCHEMAS
from mlxio.run import checkpoint
from mlxio.run.config import to_dict
from recipes import rlaif_qwen as rq
from recipes.rlaif_config import PRESETS, load_policy
from recipes.rlaif_worker import make_worker
from tests.recipes.test_rlaif_e2e import SPECS, LetterReward, make_problems, write_problems

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = make_problems("W", SPECS[:6])


def letters(texts):
    return np.array(LetterReward().score(None, texts), np.float32)


@pytest.fixture(scope="module")
def problems_file(tmp_path_factory):
    return write_problems(tmp_path_factory.mktemp("data") / "problems.jsonl", PROBLEMS)


def smoke_cfg(out, problems_file):
    base = PRESETS["smoke"]
    return attrs.evolve(base, out_dir=str(out), data=attrs.evolve(base.data, problems=str(problems_file)),
                        rewards=RewardConfig(execution=0.0, format=0.0, cache=False),
                        eval=EvalConfig(before=False, after=False))


def rpc_call(worker, method, **params):
    """In-process call through the server's own dispatch (schema checks included)."""
    server = worker.server()
    line = rpc.encode({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    response = json.loads(server.handle_line(line.rstrip(b"\n")))
    if "error" in response:
        raise AssertionError(f"{method}: {response['error']}")
    rpc.check(response["result"], SCHEMAS[method]["result"], f"{method} result")
    return response["result"]


def train_params(gen, advantages):
    """train_step params from a generate result: prompt + completion rows, completion mask."""
    tokens, mask = [], []
    for i, completion in enumerate(gen["completion_tokens"]):
        prompt = gen["prompt_tokens"][gen["prompt_index"][i]]
        tokens.append(prompt + completion)
        mask.append([0] * len(prompt) + [1] * len(completion))
    return {"tokens": tokens, "completion_mask": mask, "advantages": [float(a) for a in advantages]}


def group_adv(gen):
    total = letters(gen["texts"])
    return grpo.advantages_of(total, np.zeros(len(total), bool), np.array(gen["prompt_index"]), "grpo")


def lora_of(params):
    return {k: np.array(v) for k, v in tree_flatten(params) if k.endswith(("lora_a", "lora_b"))}


def assert_same_trees(a: dict, b: dict):
    assert a.keys() == b.keys() and a
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


# ------------------------------------------------------------------ numerics vs the recipe

@pytest.fixture(scope="module")
def recipe_step(tmp_path_factory, problems_file):
    """The recipe's own first step (rq.run, stopped after 1 step): its metrics and checkpoint."""
    out = tmp_path_factory.mktemp("recipe")
    cfg = smoke_cfg(out, problems_file)
    rq.run(cfg, stop_after=1, extra_rewards=[(LetterReward(), 1.0)])
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    path, trees, meta = checkpoint.load_latest(out)
    return cfg, record, trees


def test_train_step_equals_the_recipes_step(recipe_step, tmp_path):
    cfg, record, trees = recipe_step
    worker = make_worker()
    init = rpc_call(worker, "initialize", preset="smoke", config={**to_dict(cfg), "out_dir": str(tmp_path)},
                    protocol_version=PROTOCOL_VERSION)
    assert init["protocol_version"] == PROTOCOL_VERSION and init["step"] == 0
    # the recipe's step-0 prompts, sampled with the worker's defaults (the recipe's seed)
    train, _ = load_problems(cfg.data)
    prompts = [instruction(train[i]) for i in grpo.prompt_indices(0, cfg.prompts_per_step, len(train), cfg.train.seed)]
    gen = rpc_call(worker, "generate", prompts=prompts)
    assert len(gen["texts"]) == cfg.prompts_per_step * cfg.group_size
    adv = group_adv(gen)
    assert np.abs(adv).max() > 0  # the step has a signal (else the LoRA would not move)
    result = rpc_call(worker, "train_step", **train_params(gen, adv))
    assert result["step"] == 1 and result["skipped"] == 0
    for key in ("loss", "pg_loss", "kl", "grad_norm", "entropy", "lr"):
        assert result[key] == record[key], key  # bit-identical floats
    saved = rpc_call(worker, "save")
    w_trees, meta = checkpoint.load(saved["path"])
    assert_same_trees({k: v for k, v in tree_flatten(w_trees["trainable"])},
                      {k: v for k, v in tree_flatten(trees["trainable"])})
    assert_same_trees(dict(tree_flatten(w_trees["opt_state"])), dict(tree_flatten(trees["opt_state"])))
    # the LoRA moved: not trivially equal to the fresh adapters
    fresh = lora_of(load_policy(cfg).model.parameters())
    assert any(not np.array_equal(fresh[k], np.array(v)) for k, v in tree_flatten(w_trees["trainable"])
               if k.endswith("lora_b"))


def test_worker_loads_the_recipes_checkpoint(recipe_step):
    """Same checkpoints both ways: the worker resumes from the recipe's run dir."""
    cfg, record, trees = recipe_step
    worker = make_worker()
    rpc_call(worker, "initialize", preset="smoke", config=to_dict(cfg))
    loaded = rpc_call(worker, "load")
    assert loaded["step"] == 1 and loaded["path"].endswith("step-00000001")
    assert_same_trees(lora_of(worker.session.params),
                      {f"{k}": np.array(v) for k, v in tree_flatten(trees["trainable"])})
    # another config (another run identity) is refused by name
    other = make_worker()
    rpc_call(other, "initialize", preset="smoke", config={**to_dict(cfg), "beta": 0.5})
    response = json.loads(other.server().handle_line(rpc.encode(
        {"jsonrpc": "2.0", "id": 2, "method": "load", "params": {}}).rstrip()))
    assert response["error"]["code"] == rpc.CHECKPOINT_ERROR and "config_hash" in response["error"]["message"]


def test_load_resumes_exactly_and_given_logprobs_match(problems_file, tmp_path):
    cfg = smoke_cfg(tmp_path / "run", problems_file)
    config = to_dict(cfg)
    a = make_worker()
    rpc_call(a, "initialize", preset="smoke", config=config)
    gen1 = rpc_call(a, "generate", prompts=["def f(x):", "sort a list"], temperature=1.0)
    rpc_call(a, "train_step", **train_params(gen1, group_adv(gen1)))
    assert rpc_call(a, "save", meta={"position": 2})["step"] == 1
    gen2 = rpc_call(a, "generate", prompts=["reverse a string", "add two numbers"], temperature=1.0,
                    stop=["\n"], max_tokens=10)
    batch2 = train_params(gen2, group_adv(gen2))
    ref = rpc_call(a, "eval_logprobs", tokens=batch2["tokens"], reference=True)["logprobs"]
    uninterrupted = rpc_call(a, "train_step", **batch2)
    lora_a = lora_of(a.session.params)

    b = make_worker()  # a fresh worker (a new process in test_rust_client)
    rpc_call(b, "initialize", preset="smoke", config=config)
    loaded = rpc_call(b, "load")
    assert loaded == {"step": 1, "path": str(tmp_path / "run" / "checkpoints" / "step-00000001"),
                      "meta": {"position": 2}}
    resumed = rpc_call(b, "train_step", **batch2)
    assert resumed == {**uninterrupted, "seconds": resumed["seconds"]}
    assert_same_trees(lora_a, lora_of(b.session.params))

    c = make_worker()  # the KL reference given by the client instead
    rpc_call(c, "initialize", preset="smoke", config=config)
    rpc_call(c, "load")
    given = rpc_call(c, "train_step", **batch2, ref_logprobs=ref)
    for key in ("loss", "pg_loss", "kl", "grad_norm"):
        assert given[key] == pytest.approx(uninterrupted[key], rel=1e-5, abs=1e-7), key
    # log-probs line up with the tokens: row i has len(tokens[i]) - 1 entries
    assert [len(r) for r in ref] == [len(t) - 1 for t in batch2["tokens"]]


def rpc_error(worker, method, **params) -> dict:
    line = rpc.encode({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    return json.loads(worker.server().handle_line(line.rstrip(b"\n")))["error"]


def test_load_takes_a_checkpoint_written_before_newer_options(problems_file, tmp_path):
    """The worker's load applies --resume's rule (mlxio.run.context.check_config): a checkpoint
    whose recorded config lacks settings added since (here the memory section) loads where this
    config leaves them at their defaults, by the newest and by step; one this config sets
    otherwise is refused naming that setting alone (not out_dir, outside the hash)."""
    cfg = smoke_cfg(tmp_path / "run", problems_file)
    worker = make_worker()
    rpc_call(worker, "initialize", preset="smoke", config=to_dict(cfg))
    s = worker.session
    old = {k: v for k, v in to_dict(cfg).items() if k != "memory"}  # written before memory.* existed
    old["out_dir"] = "where/it/was/written"
    checkpoint.save(tmp_path / "run", 3, {"trainable": s.params, "opt_state": s.state},
                    {**s.run_id, "config_hash": grpo.config_hash(old), "rng": checkpoint.rng_snapshot(),
                     "config": old, "client": {"position": 6}})
    assert rpc_call(worker, "load") == {"step": 3, "path": str(tmp_path / "run" / "checkpoints" / "step-00000003"),
                                        "meta": {"position": 6}}
    assert rpc_call(worker, "load", step=3)["step"] == 3

    other = make_worker()
    rpc_call(other, "initialize", preset="smoke", config={**to_dict(cfg), "memory": {"logprob_chunk": 256}})
    for params in ({}, {"step": 3}):
        error = rpc_error(other, "load", **params)
        assert error["code"] == rpc.CHECKPOINT_ERROR, error
        assert error["message"].endswith("changed: memory.logprob_chunk: '<absent>' -> 256 (not in the checkpoint's "
                                          "config; it resumes with the default 512)"), error["message"]


def test_two_writers_never_share_a_run_directory(problems_file, tmp_path):
    """save and load take the recipes' out_dir lock: while another process holds the folder
    both are refused with one line naming the folder and the holder, writing nothing; once
    the worker holds it, a recipe run into it (another process) is refused naming the worker."""
    out = tmp_path / "run"
    out.mkdir()
    worker = make_worker()
    rpc_call(worker, "initialize", preset="smoke", config=to_dict(smoke_cfg(out, problems_file)))
    with holding(out) as holder:
        for method in ("save", "load"):
            error = rpc_error(worker, method)
            assert error["code"] == rpc.OUT_DIR_BUSY and error["data"] == {"field": "params.dir", "dir": str(out)}
            message = error["message"]
            assert "another run is writing this folder" in message and str(out) in message, message
            assert f"held by pid {holder.pid} on " in message and "\n" not in message, message
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
    assert rpc_call(worker, "save")["step"] == 0  # free again: the worker takes it
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    recipe = subprocess.run([sys.executable, "-m", "recipes.rlaif_qwen", "--preset", "smoke", "--resume",
                             "--out_dir", str(out), "--sandbox.allow_weak", "true"],
                            cwd=ROOT, env=env, capture_output=True, timeout=300)
    lines = recipe.stderr.decode().strip().splitlines()
    assert recipe.returncode != 0 and "another run is writing this folder" in lines[-1], lines[-5:]
    assert f"held by pid {os.getpid()} on " in lines[-1] and str(out) in lines[-1], lines[-1]
    assert checkpoint.step_numbers(out) == [0]


def test_generate_stop_strings_and_logprobs(problems_file, tmp_path):
    worker = make_worker()
    rpc_call(worker, "initialize", preset="smoke", config=to_dict(smoke_cfg(tmp_path, problems_file)))
    free = rpc_call(worker, "generate", prompts=["abc"], n=6, max_tokens=24, temperature=1.0, seed=7)
    assert all(len(c) == len(lp) for c, lp in zip(free["completion_tokens"], free["logprobs"], strict=True))
    # a stop string the model does produce (an ASCII byte: the tiny tokenizer's ids 0-255 are
    # bytes): one sequence, so the draws up to the stop are the same with and without it
    for seed in range(20):
        one = rpc_call(worker, "generate", prompts=["abc"], n=1, max_tokens=24, temperature=1.0, seed=seed)
        tokens = one["completion_tokens"][0]
        found = [k for k, t in enumerate(tokens[:-1]) if k >= 1 and chr(t).isascii() and chr(t).isalnum()]
        if found:
            break
    k = found[0]
    stop = chr(tokens[k])
    k = tokens.index(tokens[k])  # its first occurrence
    cut = rpc_call(worker, "generate", prompts=["abc"], n=1, max_tokens=24, temperature=1.0, seed=seed,
                   stop=[stop])
    assert cut["completion_tokens"][0] == tokens[:k + 1] and cut["finished"] == [True]
    assert stop not in cut["texts"][0] and one["texts"][0].startswith(cut["texts"][0])
    # the sampling-time log-probs are the teacher-forced ones (temperature 1)
    rows = [free["prompt_tokens"][0] + c for c in free["completion_tokens"]]
    forced = rpc_call(worker, "eval_logprobs", tokens=rows)["logprobs"]
    for i, lp in enumerate(free["logprobs"]):
        start = len(free["prompt_tokens"][0]) - 1
        np.testing.assert_allclose(forced[i][start:], lp, atol=2e-4)


# ----------------------------------------------------------------------- protocol, in-process

def lines_through(server, *lines: bytes) -> list[dict]:
    out = io.BytesIO()
    server.serve(io.BytesIO(b"".join(line + b"\n" for line in lines)), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_errors_get_responses_and_the_server_goes_on():
    server = make_worker(max_line_bytes=200).server()
    req = lambda i, m, **p: json.dumps({"jsonrpc": "2.0", "id": i, "method": m, "params": p}).encode()  # noqa: E731
    got = lines_through(
        server,
        b"{not json",
        req(1, "no_such_method"),
        req(2, "generate", prompts="not a list"),
        req(3, "train_step", tokens=[[1, 2]], completion_mask=[[0, 1]], advantages=["x"]),
        b"[" + b"1," * 400 + b"1]",  # over max_line_bytes (and never parsed)
        json.dumps({"id": 4, "method": "generate"}).encode(),  # no "jsonrpc"
        req(5, "generate", prompts=["hi"]),  # before initialize
        req(6, "save", unknown=1),
        json.dumps({"jsonrpc": "2.0", "method": "generate"}).encode(),  # notification: no answer
        b"[" + req(7, "nope") + b"," + req(8, "shutdown") + b"]",  # batch, then stop
        req(9, "generate", prompts=["never read"]),
    )
    codes = [(r.get("id"), r["error"]["code"]) for r in got[:-1]]
    assert codes == [(None, rpc.PARSE_ERROR), (1, rpc.METHOD_NOT_FOUND), (2, rpc.INVALID_PARAMS),
                     (3, rpc.INVALID_PARAMS), (None, rpc.REQUEST_TOO_LARGE),
                     (4, rpc.INVALID_REQUEST), (5, rpc.NOT_INITIALIZED), (6, rpc.INVALID_PARAMS)]
    assert got[2]["error"]["data"] == {"field": "params.prompts"}
    assert got[3]["error"]["message"].startswith("params.advantages[0]: expected number")
    assert got[4]["error"]["data"] == {"max_line_bytes": 200}
    assert "params.unknown: unknown field" in got[7]["error"]["message"]
    batch = got[-1]
    assert [r["id"] for r in batch] == [7, 8] and batch[0]["error"]["code"] == rpc.METHOD_NOT_FOUND
    assert batch[1]["result"] == {"step": 0}  # shutdown answered; request 9 never read


def test_initialize_names_what_is_wrong():
    server = make_worker().server()

    def error(params):
        line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})
        return json.loads(server.handle_line(line.encode()))["error"]

    bad_key = error({"preset": "smoke", "config": {"optim": {"lrate": 1e-3}}})
    assert bad_key["code"] == rpc.INVALID_PARAMS and "lrate" in bad_key["message"]
    bad_value = error({"preset": "smoke", "config": {"train": {"accum": 3}}})  # 2 x 4 completions
    assert bad_value["code"] == rpc.INVALID_PARAMS and "train.accum=3" in bad_value["message"]
    old_name = error({"preset": "smoke", "config": {"accum": 3}})  # the old name still reads as train.accum
    assert old_name["code"] == rpc.INVALID_PARAMS and "train.accum=3" in old_name["message"]
    assert "nope" in error({"preset": "nope"})["message"]
    assert error({"protocol_version": "2.0"})["data"] == {"field": "params.protocol_version"}


def test_deep_nesting_and_unencodable_results_are_errors():
    nan = rpc.Method(lambda p: {"x": float("nan")}, {"type": "object"}, {"type": "object"})
    odd = rpc.Method(lambda p: {"x": object()}, {"type": "object"}, {"type": "object"})
    server = rpc.Server({"nan": nan, "odd": odd})
    got = lines_through(server, b"[" * 100_000 + b"]" * 100_000,
                        b'{"jsonrpc":"2.0","id":1,"method":"nan"}',
                        b'{"jsonrpc":"2.0","id":2,"method":"odd"}',
                        b'{"jsonrpc":"2.0","id":3,"method":"nan","params":[1]}')
    assert [(r["id"], r["error"]["code"]) for r in got] == [
        (None, rpc.PARSE_ERROR), (1, rpc.WORKER_ERROR), (2, rpc.WORKER_ERROR), (3, rpc.INVALID_PARAMS)]
    assert "not JSON-able" in got[1]["error"]["message"]


def test_schema_checker_names_the_field():
    schema = SCHEMAS["train_step"]["params"]
    good = {"tokens": [[1, 2, 3]], "completion_mask": [[0, 1, 1]], "advantages": [0.5]}
    rpc.check(good, schema)
    for bad, field in [({**good, "tokens": [[1, -2, 3]]}, "params.tokens[0][1]"),
                       ({**good, "tokens": [[1]]}, "params.tokens[0]"),
                       ({**good, "advantages": [True]}, "params.advantages[0]"),
                       ({**good, "completion_mask": [[0, 2, 1]]}, "params.completion_mask[0][1]"),
                       ({k: v for k, v in good.items() if k != "advantages"}, "params.advantages")]:
        with pytest.raises(rpc.RpcError) as err:
            rpc.check(bad, schema)
        assert err.value.code == rpc.INVALID_PARAMS and err.value.data == {"field": field}


def test_docs_carry_the_code_schemas():
    """docs/worker-protocol.md shows each method's params and result schema as the code has them."""
    text = (ROOT / "docs" / "worker-protocol.md").read_text()
    assert f"Protocol version: `{PROTOCOL_VERSION}`" in text
    for method, schemas in SCHEMAS.items():
        section = re.search(rf"^### `{method}`\n(.*?)(?=^### |\Z)", text, re.S | re.M)
        assert section, method
        blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)\n```", section.group(1), re.S)]
        assert blocks[:2] == [schemas["params"], schemas["result"]], method


# ------------------------------------------------------------------------- over real pipes

def start_worker(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "recipes.rlaif_worker", "--log-level", "WARNING",
                             *args], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_stdio_pipelined_requests_eof_and_checkpoint(problems_file, tmp_path):
    """Requests written at once (while a long train_step runs) are answered in order; a
    malformed or oversized line in between gets its error; EOF ends the process cleanly with
    the last checkpoint intact."""
    cfg = to_dict(smoke_cfg(tmp_path / "run", problems_file))
    req = lambda i, m, **p: json.dumps({"jsonrpc": "2.0", "id": i, "method": m, "params": p})  # noqa: E731
    tokens = [[257, 65, 66, 67, 258, 68, 69, 70], [257, 65, 66, 67, 258, 71, 72]]
    mask = [[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1]]
    step = dict(tokens=tokens, completion_mask=mask, advantages=[1.0, -1.0])
    lines = [req(1, "initialize", preset="smoke", config=cfg), req(2, "train_step", **step),
             req(3, "save"), "}{", "x" * 5000, req(4, "train_step", **step), req(5, "nope"),
             req(6, "eval_logprobs", tokens=tokens)]
    proc = start_worker("--max-line-bytes", "4096")
    out, err = proc.communicate("".join(line + "\n" for line in lines).encode(), timeout=600)
    assert proc.returncode == 0, err.decode()[-2000:]
    got = [json.loads(line) for line in out.decode().splitlines()]  # stdout: protocol lines only
    assert [r["id"] for r in got] == [1, 2, 3, None, None, 4, 5, 6]
    assert [r["error"]["code"] for r in got if "error" in r] == [
        rpc.PARSE_ERROR, rpc.REQUEST_TOO_LARGE, rpc.METHOD_NOT_FOUND]
    for r, m in zip([got[i] for i in (0, 1, 2, 5, 7)],
                    ["initialize", "train_step", "save", "train_step", "eval_logprobs"], strict=True):
        rpc.check(r["result"], SCHEMAS[m]["result"], m)
    assert got[1]["result"]["step"] == 1 and got[5]["result"]["step"] == 2
    # EOF: exit 0, nothing half-written; LATEST names the checkpoint saved, which verifies
    root = tmp_path / "run" / "checkpoints"
    assert (root / "LATEST").read_text().strip() == "step-00000001"
    assert checkpoint.verify(root / "step-00000001")["step"] == 1
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp")]
