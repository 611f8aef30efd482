"""The RLAIF worker's side of the wire: JSON-RPC 2.0 on stdio for an external trainer (`serve_stdio`:
the protocol on a private copy of fd 1, logs on stderr), and the checks and shapes of its
requests (`rows_param`, `padded`, `check_generate`, `check_rows`, `merged`, `finite`).

The seed's design: a trainer in another language (Rust) drives MLX through a Python process;
rewards are computed in the trainer. One process serves both roles:

    generator: generate(prompts, n, ...) -> completions with token ids and log-probs
    trainer:   train_step(token ids, completion masks, advantages[, reference log-probs])
               -> loss, pg_loss, kl, grad_norm, step;  save / load / eval_logprobs

The methods (`mlxio.rl.worker_methods`) are the RLAIF recipe's own: its config, session
(`mlxio.rl.session`: policy, loss, compiled step), batch and atomic checkpoints, so a
train_step there equals the recipe's step on the same batch and a checkpoint either writes the
other resumes. Protocol and schemas: docs/worker-protocol.md and mlxio.rl.worker_protocol;
framing: mlxio.rpc.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from importlib import metadata

import numpy as np

from mlxio import rpc
from mlxio.errors import ConfigError, StrictArgumentParser, one_line
from mlxio.redact import install_log_redaction
from mlxio.rl import memory_bounds
from mlxio.rl.prompt_limits import prompt_overflow
from mlxio.rl.worker_protocol import MAX_GENERATE_ROWS, PROTOCOL_VERSION
from mlxio.run import budget

log = logging.getLogger("mlxio.worker")

PAD_ID = 0  # the recipe's packing pad (masked out of every loss term)

def rows_param(params: dict, name: str, n: int, lengths: list[int] | None) -> list:
    """The n rows of request parameter `name` (each of `lengths[i]` entries when given), else
    INVALID_PARAMS naming the field."""
    rows = params[name]
    if len(rows) != n:
        raise rpc.RpcError(rpc.INVALID_PARAMS, f"params.{name}: {len(rows)} rows for {n} sequences",
                           {"field": f"params.{name}"})
    if lengths is not None:
        for i, (row, want) in enumerate(zip(rows, lengths, strict=True)):
            if len(row) != want:
                raise rpc.RpcError(rpc.INVALID_PARAMS, f"params.{name}[{i}]: {len(row)} entries, "
                                   f"expected {want}", {"field": f"params.{name}[{i}]"})
    return rows


def padded(rows: list[list], width: int, dtype, fill=0) -> np.ndarray:
    """[len(rows), width] of `dtype`: each row left-aligned, `fill` after it."""
    out = np.full((len(rows), width), fill, dtype)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def check_generate(model_config: dict, prompts: int, n: int, max_tokens: int, prompt_tokens: int = 16) -> None:
    """A `generate` that cannot finish is refused before it starts (INVALID_PARAMS naming the
    field): more than MAX_GENERATE_ROWS sequences, more tokens than the model's positions, or
    a KV cache larger than the machine's memory (`mlxio.rl.memory_bounds`)."""
    rows = prompts * n
    if rows > MAX_GENERATE_ROWS:
        raise rpc.RpcError(rpc.INVALID_PARAMS, f"params.n: {prompts} prompts x n={n} = {rows} sequences, more than "
                           f"{MAX_GENERATE_ROWS} in one request; split it into several", {"field": "params.n"})
    limit = model_config.get("max_position_embeddings")
    if isinstance(limit, int) and 0 < limit < max_tokens:
        raise rpc.RpcError(rpc.INVALID_PARAMS, f"params.max_tokens: {max_tokens} is more than the model's "
                           f"max_position_embeddings ({limit})", {"field": "params.max_tokens"})
    try:
        budget.require(memory_bounds.rollout_bytes(rows, max_tokens + prompt_tokens, model_config), "params.n", n,
                       f"{rows} sequences x {max_tokens} tokens (KV cache)", "ask for fewer sequences or tokens")
    except ConfigError as err:
        raise rpc.RpcError(rpc.INVALID_PARAMS, str(err), {"field": "params.n"}) from None


def check_prompts(model_config: dict, tokenizer, prompts: list[str], max_tokens: int,
                  encode: Callable[[str], list[int]]) -> int:
    """The longest prompt's token count, once every prompt plus `max_tokens` fits the model's
    positions (`mlxio.rl.prompt_limits`); else INVALID_PARAMS naming `params.prompts[i]`."""
    longest, over = prompt_overflow(model_config, tokenizer, prompts, max_tokens, encode)
    if over is not None:
        i, why = over
        raise rpc.RpcError(rpc.INVALID_PARAMS, f"params.prompts[{i}]: {why}; send a shorter prompt or ask for fewer "
                           "tokens", {"field": f"params.prompts[{i}]"})
    return longest


def check_rows(model_config: dict, rows: list, accum: int) -> None:
    """Token rows a `train_step` / `eval_logprobs` can take: at most MAX_GENERATE_ROWS, each
    within the model's positions, one of `accum` micro-batches' logits within the machine's
    memory."""
    if len(rows) > MAX_GENERATE_ROWS:
        raise rpc.RpcError(rpc.INVALID_PARAMS, f"params.tokens: {len(rows)} sequences, more than {MAX_GENERATE_ROWS} "
                           "in one request; split it", {"field": "params.tokens"})
    longest = max((len(r) for r in rows), default=0)
    limit = model_config.get("max_position_embeddings")
    if isinstance(limit, int) and 0 < limit < longest:
        raise rpc.RpcError(rpc.INVALID_PARAMS, f"params.tokens: a sequence of {longest} tokens, more than the model's "
                           f"max_position_embeddings ({limit})", {"field": "params.tokens"})
    per_micro = max(len(rows) // max(accum, 1), 1)
    try:
        budget.require(memory_bounds.update_bytes(per_micro, longest, model_config), "params.tokens", f"{len(rows)} rows",
                       f"micro-batches of {per_micro} sequences x {longest} tokens of logits",
                       "send fewer or shorter sequences (or initialize with a larger train.accum)")
    except ConfigError as err:
        raise rpc.RpcError(rpc.INVALID_PARAMS, str(err), {"field": "params.tokens"}) from None


def merged(base: dict, overrides: dict) -> dict:
    """`base` with `overrides` laid over it, nested dicts merged key by key."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def finite(result: dict) -> dict:
    """JSON has no NaN / Infinity: a non-finite metric is sent as null."""
    return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in result.items()}


def version_of(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


# -------------------------------------------------------------------------------- stdio

def protocol_stdout():
    """Take fd 1 for the protocol and point fd 1 (and sys.stdout) at stderr, so a stray print
    or a C library's write can never corrupt the protocol stream; returns the protocol file."""
    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MIN_LINE_BYTES, MAX_LINE_BYTES = 1024, 1 << 30


def _line_bytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a byte count, got {text!r}") from None
    if not MIN_LINE_BYTES <= value <= MAX_LINE_BYTES:
        raise argparse.ArgumentTypeError(f"expected {MIN_LINE_BYTES}..{MAX_LINE_BYTES} bytes, got {value}")
    return value


def serve_stdio(argv: list[str] | None, server_of: Callable[[int], rpc.Server], prog: str, description: str) -> int:
    """Serve the worker (`server_of(max_line_bytes)`: its methods' server) on stdin/stdout until
    EOF or shutdown; returns the exit status. `description`: its --help text, lines as written."""
    parser = StrictArgumentParser(prog=prog, description=description,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-line-bytes", type=_line_bytes, default=rpc.DEFAULT_MAX_LINE_BYTES,
                        help=f"longest accepted request line ({MIN_LINE_BYTES}..{MAX_LINE_BYTES}); longer ones "
                             "get an error response")
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS, help="stderr log level")
    try:
        args = parser.parse_args(argv)
    except ConfigError as err:  # the error contract: one line, exit 2 (before the protocol starts)
        print(f"{prog}: error: {one_line(err.contract_line())}", file=sys.stderr)
        return 2
    proto = protocol_stdout()
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="%(asctime)s worker[%(process)d] %(levelname)s %(message)s")
    install_log_redaction()  # no credential (a teacher URL's user:pass@) reaches a log line
    server = server_of(args.max_line_bytes)
    log.info("ready (protocol %s, max line %d bytes)", PROTOCOL_VERSION, args.max_line_bytes)
    how = server.serve(sys.stdin.buffer, proto)
    log.info("exiting on %s", how)
    proto.close()
    return 0
