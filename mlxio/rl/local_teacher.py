"""Local AI-feedback teachers: `LocalJudge` scores with a causal LM in this process (mlx-lm model
definitions and generation), `MlxLmServer` serves one over mlx-lm's OpenAI-compatible HTTP
server for `mlxio.rl.teacher.HttpJudge`. The rubric, the score parsing and the deadline
contract are `mlxio.rl.teacher`'s.
"""

from __future__ import annotations

import http.client
import logging
import math
import socket
import threading
import time

from mlxio.rl.review_score import MAX_REVIEW_CHARS, parse_score
from mlxio.rl.teacher import (
    PREFILL_CHUNK,
    SCORINGS,
    answer_word,
    rubric_hash,
    rubric_messages,
    verdict_score,
)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- local judge

def answer_token_ids(tokenizer) -> dict[str, list[int]]:
    """{"yes": ids, "no": ids}: every vocabulary token that reads as that answer once case,
    punctuation and spacing are dropped ("Yes", " no", "No.", ...; `answer_word`)."""
    out: dict[str, list[int]] = {"yes": [], "no": []}
    for i in sorted(set(tokenizer.get_vocab().values())):
        word = answer_word(tokenizer.decode([i]))
        if word in out:
            out[word].append(i)
    return out


class LocalJudge:
    """Judge with a local causal LM (mlx-lm model definitions and generation).

    `model_path`: anything `mlxio.weights.llm.load_policy` reads (an mlx-lm / HF directory, a GGUF
    file, a hub id, or None for the embedded SmolLM2-135M-Instruct); loaded on first use (the
    load is outside the deadline), dequantised to float32 unless `dequantize` is False (MLX's
    CPU quantised kernels are far slower than float32 through OpenBLAS). Generation is greedy and serialised by a lock (one model,
    many reward threads); each call finishes within `timeout_s`, waiting for the lock included:
    generation stops at the deadline (a partial answer usually holds no score: missing).
    """

    def __init__(self, model_path: str | None = None, max_tokens: int = 128,
                 timeout_s: float = 60.0, scoring: str = "text", dequantize: bool = True) -> None:
        if scoring not in SCORINGS:
            raise ValueError(f"scoring {scoring!r}: expected one of {SCORINGS}")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s}")
        self.model_path, self.max_tokens = model_path, max_tokens
        self.timeout_s, self.scoring, self.dequantize = timeout_s, scoring, dequantize
        self.last_error: str | None = None
        self._policy = None
        self._answer_ids: dict[str, list[int]] | None = None
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()

    def config_key(self) -> str:
        tokens = 1 if self.scoring == "verdict" else self.max_tokens
        return (f"local|{self.model_path}|n={tokens}|scoring={self.scoring}|"
                f"rubric={rubric_hash(self.scoring)}")

    def _load(self):
        with self._load_lock:
            if self._policy is None:
                from mlxio.weights.llm import load_policy

                self._policy = (load_policy(self.model_path, dequantize=True, dtype="float32")
                                if self.dequantize else load_policy(self.model_path))
        return self._policy

    def _prompt(self, messages: list[dict[str, str]]) -> str:
        return self._load().tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                          tokenize=False)

    def complete(self, messages: list[dict[str, str]], deadline: float | None = None) -> str:
        """Greedy answer to `messages`, cut at `deadline` (time.monotonic(); default: now +
        timeout_s). Raises TimeoutError when the model stays busy until the deadline."""
        from mlx_lm.generate import stream_generate

        policy = self._load()
        prompt = self._prompt(messages)
        deadline = time.monotonic() + self.timeout_s if deadline is None else deadline
        if not self._lock.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            raise TimeoutError(f"model busy for the whole {self.timeout_s:g} s deadline")
        def check(done: int, total: int) -> None:  # between prompt chunks
            if time.monotonic() >= deadline:
                raise TimeoutError(f"prompt not read within the {self.timeout_s:g} s deadline "
                                   f"({done} of {total} tokens)")

        try:
            parts = []
            for out in stream_generate(policy.model, policy.tokenizer, prompt,
                                       max_tokens=self.max_tokens,
                                       prefill_step_size=PREFILL_CHUNK,
                                       prompt_progress_callback=check):
                parts.append(out.text)
                if time.monotonic() >= deadline:
                    self.last_error = (f"local judge: generation cut at the {self.timeout_s:g} s"
                                       f" deadline after {out.generation_tokens} tokens")
                    log.warning("%s", self.last_error)
                    break
            return "".join(parts)
        finally:
            self._lock.release()

    def _verdict(self, messages: list[dict[str, str]], deadline: float) -> float | None:
        import mlx.core as mx

        policy = self._load()
        tok = policy.tokenizer
        ids = tok.encode(self._prompt(messages), add_special_tokens=False)
        if self._answer_ids is None:
            self._answer_ids = answer_token_ids(tok)
        words = self._answer_ids
        if not self._lock.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            raise TimeoutError(f"model busy for the whole {self.timeout_s:g} s deadline")
        try:
            from mlx_lm.models.cache import make_prompt_cache

            cache = make_prompt_cache(policy.model)
            for start in range(0, len(ids), PREFILL_CHUNK):  # the deadline checked per chunk
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"prompt not read within the {self.timeout_s:g} s "
                                       f"deadline ({start} of {len(ids)} tokens)")
                logits = policy.model(mx.array([ids[start:start + PREFILL_CHUNK]]), cache=cache)
                mx.eval(logits)
            probs = mx.softmax(logits[0, -1].astype(mx.float32))
            vocab = probs.shape[0]
            p = {w: float(probs[mx.array([i for i in ids if i < vocab])].sum()) if ids else 0.0
                 for w, ids in words.items()}
        finally:
            self._lock.release()
        return verdict_score(p["yes"], p["no"])

    def judge(self, prompt: str, completion: str) -> float | None:
        """0-10 score of `completion` for `prompt`, or None when the model gave no score in
        time (the reason logged and kept in `last_error`)."""
        messages = rubric_messages(prompt, completion, self.scoring)
        self._load()
        deadline = time.monotonic() + self.timeout_s
        try:
            if self.scoring == "verdict":
                score = self._verdict(messages, deadline)
            else:
                review = self.complete(messages, deadline)
                if len(review) > MAX_REVIEW_CHARS:
                    raise ValueError(f"review of {len(review)} characters is over the {MAX_REVIEW_CHARS}-character limit")
                score = parse_score(review)
            if score is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"answer read after the {self.timeout_s:g} s deadline")
            return score
        except (RuntimeError, ValueError, TimeoutError) as err:
            self.last_error = f"local judge: {err}"
            log.warning("%s; reward marked missing", self.last_error)
            return None


# ---------------------------------------------------------------- a local teacher server

class MlxLmServer:
    """`python -m mlx_lm server` on 127.0.0.1 serving `model_dir` (with the LoRA adapters in
    `adapter_path`, mlx-lm's format, when given), as a context manager (for
    tests, benchmarks and the documented recipe run). OpenBLAS is preloaded into it (the same
    fast-BLAS fix as `mlxio.blas`, through LD_PRELOAD). `url` is its `/v1` base; `model` the
    name to ask for ("default_model": the --model it serves). Output goes to `log_path`.
    """

    model = "default_model"

    def __init__(self, model_dir, port: int | None = None, log_path=None,
                 start_timeout_s: float = 120.0, adapter_path=None) -> None:
        self.model_dir, self.start_timeout_s = str(model_dir), start_timeout_s
        self.adapter_path = None if adapter_path is None else str(adapter_path)
        if port is None:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        self.port, self.log_path = port, log_path
        self.url = f"http://127.0.0.1:{port}/v1"
        self.proc = None

    def command(self) -> list[str]:
        import sys

        adapter = ["--adapter-path", self.adapter_path] if self.adapter_path else []
        return [sys.executable, "-m", "mlx_lm", "server", "--model", self.model_dir, *adapter,
                "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "WARNING"]

    def __enter__(self) -> MlxLmServer:
        import os
        import subprocess

        from mlxio.blas import find_openblas

        env = dict(os.environ)
        blas = find_openblas()
        if blas and os.environ.get("MLXIO_BLAS", "auto") != "off":
            env["LD_PRELOAD"] = ":".join(filter(None, [blas, env.get("LD_PRELOAD")]))
        from mlxio.atomic import open_in_place

        out = os.fdopen(open_in_place(self.log_path, "teacher server log", append=True), "ab") \
            if self.log_path else subprocess.DEVNULL  # never through a link planted at the log's path
        try:
            self.proc = subprocess.Popen(self.command(), env=env, stdout=out,
                                         stderr=subprocess.STDOUT)
        finally:
            if self.log_path:
                out.close()
        try:
            self.wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def wait_ready(self) -> None:
        """Poll `GET /v1/models` until it answers 200 (RuntimeError if the server exits or
        `start_timeout_s` passes)."""
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlx_lm server exited with {self.proc.returncode} "
                                   f"(log: {self.log_path})")
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2.0)
            try:
                conn.request("GET", "/v1/models")
                if conn.getresponse().status == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()
            time.sleep(0.25)
        raise RuntimeError(f"mlx_lm server not answering after {self.start_timeout_s:g} s "
                           f"(log: {self.log_path})")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:  # noqa: BLE001
                self.proc.kill()
                self.proc.wait()
