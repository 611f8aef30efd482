"""The RLAIF worker's methods (initialize, generate, train_step, eval_logprobs, save, load,
shutdown) behind its wire (`mlxio.rl.worker`): each a JSON-RPC method over the recipe's config,
session (`mlxio.rl.session`), batch and checkpoints, so a train_step here equals the recipe's
step on the same batch and a checkpoint either writes the other resumes. The recipe binds its
presets, checks and session builder (`recipes.rlaif_worker`)."""

from __future__ import annotations

import math
import platform
import random
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlxcore.rl import packing
from mlxcore.rl import policy as pg
from mlxcore.train import buckets
from mlxio import rpc
from mlxio.errors import CheckpointError, ConfigError, RunError
from mlxio.gpu import kernel_cache
from mlxio.redact import redact_config
from mlxio.rl import grpo, rollout
from mlxio.rl.session import Session
from mlxio.rl.worker import (
    PAD_ID,
    check_generate,
    check_prompts,
    check_rows,
    finite,
    merged,
    padded,
    rows_param,
    version_of,
)
from mlxio.rl.worker_protocol import PROTOCOL_VERSION, SCHEMAS
from mlxio.run import checkpoint, context
from mlxio.run.checks import check_path_text
from mlxio.run.config import default_values, from_dict, to_dict
from mlxio.weights import llm_lora


class Worker:
    """The methods over the recipe's `presets` ({name: Config}), `validate(cfg)` (ConfigError on
    a bad config), `open_session(cfg) -> Session` and `batch_settings(cfg)` (the keyword
    arguments of `mlxio.rl.grpo.build_batch`): recipes.rlaif_config's."""

    def __init__(self, presets: dict, validate: Callable, open_session: Callable[..., Session],
                 batch_settings: Callable[..., dict], max_line_bytes: int = rpc.DEFAULT_MAX_LINE_BYTES) -> None:
        self.presets, self.validate = presets, validate
        self.open_session, self.batch_settings = open_session, batch_settings
        self.max_line_bytes = max_line_bytes
        self.session: Session | None = None
        self.cfg = None  # the session's config

    def methods(self) -> dict[str, rpc.Method]:
        fns = {"initialize": self.initialize, "generate": self.generate,
               "train_step": self.train_step, "eval_logprobs": self.eval_logprobs,
               "save": self.save, "load": self.load, "shutdown": self.shutdown}
        return {name: rpc.Method(fn, SCHEMAS[name]["params"], SCHEMAS[name]["result"],
                                 (fn.__doc__ or "").strip()) for name, fn in fns.items()}

    def server(self) -> rpc.Server:
        return rpc.Server(self.methods(), self.max_line_bytes,
                          {ConfigError: rpc.CONFIG_ERROR, CheckpointError: rpc.CHECKPOINT_ERROR})

    def _session(self) -> Session:
        if self.session is None:
            raise rpc.RpcError(rpc.NOT_INITIALIZED, "call initialize first")
        return self.session

    # methods -----------------------------------------------------------------------------
    def initialize(self, params: dict) -> dict:
        """Load the model with fresh LoRA and build the optimizer and compiled step."""
        client = params.get("protocol_version")
        if client is not None and client.split(".")[0] != PROTOCOL_VERSION.split(".")[0]:
            raise rpc.RpcError(rpc.INVALID_PARAMS, f"protocol_version {client} is not compatible "
                               f"with the worker's {PROTOCOL_VERSION}", {"field": "params.protocol_version"})
        preset = params.get("preset", "quick")
        if preset not in self.presets:
            raise rpc.RpcError(rpc.INVALID_PARAMS, f"params.preset: unknown {preset!r} (known: "
                               f"{', '.join(sorted(self.presets))})", {"field": "params.preset"})
        base = self.presets[preset]
        data = merged(to_dict(base), params.get("config", {}))
        try:
            cfg = from_dict(data, type(base), "params.config")
            self.validate(cfg)
        except ConfigError as err:
            raise rpc.RpcError(rpc.INVALID_PARAMS, str(err), {"field": "params.config"}) from None
        if self.session is not None:  # a re-initialize drops the old model and its folders first
            for out in self.session.claimed:
                context.release_out_dir(out)
            self.session = None
        random.seed(cfg.train.seed)
        mx.random.seed(cfg.train.seed)
        np.random.seed(cfg.train.seed)
        s = self.session = self.open_session(cfg)
        self.cfg = cfg
        return {
            "protocol_version": PROTOCOL_VERSION,
            "versions": {"worker": version_of("mlx-retrieval-rl"), "mlx": mx.__version__,
                         "mlx_lm": version_of("mlx-lm"), "python": platform.python_version()},
            "capabilities": {
                "roles": ["generator", "trainer"], "methods": sorted(SCHEMAS),
                "max_line_bytes": self.max_line_bytes, "vocab_size": _vocab(s),
                "eos_token_ids": sorted(int(t) for t in s.policy.tokenizer.eos_token_ids),
                "pad_id": PAD_ID, "accumulation": cfg.train.accum, "inner_epochs": cfg.inner_epochs},
            "config": redact_config(to_dict(cfg)),
            "model": str(s.policy.source or cfg.model),
            "step": s.step,
        }

    def generate(self, params: dict) -> dict:
        """Sample n completions per prompt with the current policy (mlxio.rl.rollout)."""
        s = self._session()
        cfg = self.cfg
        n, max_tokens = params.get("n", cfg.group_size), params.get("max_tokens", cfg.max_new_tokens)
        chat = params.get("chat_template", True)
        check_generate(s.policy.config, len(params["prompts"]), n, max_tokens)
        longest = check_prompts(s.policy.config, s.policy.tokenizer, params["prompts"], max_tokens,
                                lambda p: rollout.encode_prompt(s.policy.tokenizer, p, chat))
        check_generate(s.policy.config, len(params["prompts"]), n, max_tokens, longest)
        t0 = time.perf_counter()
        ro = rollout.generate_group(
            llm_lora.bound_policy(s.policy, s.params), params["prompts"], n,
            params.get("temperature", cfg.temperature), params.get("top_p", cfg.top_p), max_tokens,
            params.get("seed", grpo.step_seed(cfg.train.seed, s.step)),
            use_chat_template=chat,
            stop_at_code_end=params.get("stop_at_code_end", cfg.stop_at_code_end),
            stop=tuple(params.get("stop", ())), compiled=kernel_cache.use_compile(cfg.compile))
        return {"texts": ro.texts, "prompt_tokens": ro.prompt_tokens,
                "completion_tokens": [[int(t) for t in c] for c in ro.completion_tokens],
                "logprobs": [lp.tolist() for lp in ro.logprobs],
                "prompt_index": ro.prompt_index.tolist(), "finished": ro.finished.tolist(),
                "tokens_per_s": float(ro.gen_tokens_per_s), "seconds": time.perf_counter() - t0}

    def _tokens(self, s: Session, params: dict) -> tuple[list, list[int]]:
        rows = params["tokens"]
        check_rows(s.policy.config, rows, self.cfg.train.accum)
        vocab = _vocab(s)
        for i, row in enumerate(rows):
            if max(row) >= vocab:
                raise rpc.RpcError(rpc.INVALID_PARAMS, f"params.tokens[{i}]: token id {max(row)} "
                                   f">= vocab_size {vocab}", {"field": f"params.tokens[{i}]"})
        return rows, [len(r) for r in rows]

    def train_step(self, params: dict) -> dict:
        """One recipe step (inner_epochs updates) on the given batch; the model keeps the result."""
        s = self._session()
        cfg = self.cfg
        rows, lengths = self._tokens(s, params)
        n = len(rows)
        mask_rows = rows_param(params, "completion_mask", n, lengths)
        adv = params["advantages"]
        if len(adv) != n:
            raise rpc.RpcError(rpc.INVALID_PARAMS, f"params.advantages: {len(adv)} values for {n} "
                               "sequences", {"field": "params.advantages"})
        if n % cfg.train.accum:
            raise rpc.RpcError(rpc.INVALID_PARAMS, f"params.tokens: {n} sequences is not a multiple "
                               f"of the config's train.accum={cfg.train.accum}",
                               {"field": "params.tokens"})
        width = buckets.bucket_width(max(lengths))  # the recipe's widths (pack_tokens)
        packed = {"tokens": padded(rows, width, np.int32, PAD_ID),
                  "completion_mask": padded(mask_rows, width, np.float32)}
        given = {}
        for name in ("ref_logprobs", "old_logprobs"):
            if name in params:
                logp = rows_param(params, name, n, [k - 1 for k in lengths])
                given[name] = mx.array(padded(logp, width - 1, np.float32))
        t0 = time.perf_counter()
        batch = grpo.build_batch(s.model, s.params, packed, np.asarray(adv, np.float32),
                                 np.ones(n, bool), **self.batch_settings(cfg), ref_logp=given.get("ref_logprobs"),
                                 old_logp=given.get("old_logprobs"))
        for epoch in range(cfg.inner_epochs):
            s.params, s.state, m = s.step_fn(s.params, s.state, batch,
                                             mx.array(s.step * cfg.inner_epochs + epoch))
            mx.eval(s.params, s.state, m)
        s.step += 1
        out = {k: float(v) for k, v in m.items()}
        out.update(step=s.step, skipped=int(m["skipped"]),
                   consecutive_skips=int(s.state["consecutive_skips"]),
                   tokens=int(sum(lengths)), seconds=time.perf_counter() - t0)
        return finite(out)

    def eval_logprobs(self, params: dict) -> dict:
        """Per-token log-probs of given sequences under the policy (or the LoRA-off reference)."""
        s = self._session()
        rows, lengths = self._tokens(s, params)
        width = buckets.bucket_width(max(lengths))  # the recipe's widths (pack_tokens)
        tokens = mx.array(padded(rows, width, np.int32, PAD_ID))
        weights = pg.reference_params(s.params) if params.get("reference") else s.params
        # every real target of each sequence, in micro-batches of the config's size (no logits)
        targets = padded([[1.0] * (k - 1) for k in lengths], width - 1, np.float32)
        micro = math.gcd(len(rows), -(-len(rows) // self.cfg.train.accum))
        positions = packing.target_positions(targets, micro, self.cfg.memory.logprob_chunk)
        logp = np.array(grpo.frozen_logprobs(s.model, weights, tokens, targets, positions,
                                             self.cfg.memory.logprob_chunk))
        return {"logprobs": [logp[i, :k - 1].tolist() for i, k in enumerate(lengths)]}

    def _dir(self, s: Session, params: dict) -> Path:
        return check_path_text(params.get("dir") or self.cfg.out_dir, "params.dir", "params.dir")

    def _claim(self, s: Session, out: Path) -> None:
        """Take the run directory `out` as the recipes do (`mlxio.run.context.claim_out_dir`:
        its .lock, held until re-initialize or exit), so a recipe run or another worker writing
        there is refused (OUT_DIR_BUSY, naming the folder and the holder), never interleaved."""
        try:
            if context.claim_out_dir(out, resume=True):
                s.claimed.add(out)
        except RunError as err:
            raise rpc.RpcError(rpc.OUT_DIR_BUSY, f"params.dir: {err.what} ({err.where}); wait for it to finish, "
                               "or save to another dir", {"field": "params.dir", "dir": str(out)}) from None

    def save(self, params: dict) -> dict:
        """Atomic checkpoint of LoRA + optimizer state (+ RNG, run identity), as the recipe's."""
        s = self._session()
        out = self._dir(s, params)
        out.mkdir(parents=True, exist_ok=True)
        self._claim(s, out)
        meta = {**s.run_id, "rng": checkpoint.rng_snapshot(),
                "data_position": {"prompts": s.step * self.cfg.prompts_per_step}, "config": redact_config(to_dict(self.cfg)),
                "client": params.get("meta")}
        path = checkpoint.save(out, s.step, {context.TRAINABLE: s.params, context.OPT_STATE: s.state}, meta,
                               keep_last=self.cfg.train.keep_checkpoints)
        if params.get("adapters"):
            llm_lora.save_adapters(s.model, s.params, self.cfg.lora, self.cfg.lora_layers, out / "adapters")
        return {"step": s.step, "path": str(path)}

    def load(self, params: dict) -> dict:
        """Resume from a checkpoint of this config and base model (the newest that verifies):
        the recipe's --resume rule (`mlxio.run.context.check_config`), so one written before
        newer options existed loads where this config leaves them at their defaults."""
        s = self._session()
        out = self._dir(s, params)
        if out.is_dir():  # (none: no checkpoint to load, said below)
            self._claim(s, out)
        identity = {k: v for k, v in s.run_id.items() if k != "config_hash"}  # exact; the config by the rule
        if "step" in params:
            path = out / checkpoint.CHECKPOINTS / f"step-{params['step']:08d}"
            if not path.is_dir():
                raise CheckpointError(f"{path}: no such checkpoint")
            trees, meta = checkpoint.load(path)
            for field, want in identity.items():
                if meta.get(field) != want:
                    raise CheckpointError(f"{path}: meta[{field!r}] is {meta.get(field)!r} but "
                                          f"this worker's config expects {want!r}")
        else:
            found = checkpoint.load_latest(out, expect=identity)
            if found is None:
                raise CheckpointError(f"{out}: no checkpoint to load")
            path, trees, meta = found
        config_type = type(self.cfg)
        context.check_config(path, meta, s.run_id, to_dict(self.cfg), config_type.LEGACY_KEYS, grpo.config_hash,
                             default_values(config_type))
        trees = context.current_tree_names(path, trees)
        s.params, s.state = trees[context.TRAINABLE], trees[context.OPT_STATE]
        checkpoint.rng_restore(meta["rng"])
        s.step = int(meta["step"])
        return {"step": s.step, "path": str(path), "meta": meta.get("client")}

    def shutdown(self, params: dict) -> dict:
        """Answer, then exit (0) once the answer is written."""
        raise rpc.Stop({"step": self.session.step if self.session else 0})


def _vocab(s: Session) -> int:
    return int(s.policy.config["vocab_size"])
