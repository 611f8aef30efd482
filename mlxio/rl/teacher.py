"""AI-feedback judges: a rubric prompt, a robust score parser, an HTTP judge and a local one.

A judge has `judge(prompt, completion) -> float | None` (a 0-10 score, None = missing: the
call failed or the answer held no score; never 0) and `config_key() -> str` (what changes its
scores; part of reward-cache keys).
"""

from __future__ import annotations

import email.utils
import hashlib
import http.client
import json
import logging
import math
import random
import re
import threading
import time
import urllib.error
import urllib.request

import attrs

log = logging.getLogger(__name__)

RUBRIC_SYSTEM = (
    "You are a strict senior Python reviewer. You grade a candidate solution to a coding task. "
    "Judge it on three criteria, each 0-10: correctness (does it do what the task asks, "
    "including edge cases; this matters most), style (readable, idiomatic, well named) and "
    "efficiency (no needless work for the task's input sizes). Reply with one line per "
    "criterion, then a last line exactly `Score: N/10` giving the overall score (an integer "
    "0-10, weighted towards correctness). A solution that does not run or solves a different "
    "task scores at most 2.")
RUBRIC_USER = "## Task\n{prompt}\n\n## Candidate solution\n{completion}\n\nGrade it."


def rubric_messages(prompt: str, completion: str) -> list[dict[str, str]]:
    """Chat messages asking a judge to grade `completion` for `prompt` with the rubric."""
    return [{"role": "system", "content": RUBRIC_SYSTEM},
            {"role": "user", "content": RUBRIC_USER.format(prompt=prompt, completion=completion)}]


def _rubric_hash() -> str:
    return hashlib.sha256((RUBRIC_SYSTEM + RUBRIC_USER).encode()).hexdigest()[:16]


_NUM = r"(-?\d+(?:\.\d+)?)"
_PATTERNS = (
    # "Score: 7/10", "Overall score = 7.5", "final score - 8 out of 10" (the last one wins)
    re.compile(rf"\bscore\b\s*(?:is|[:=\-])?\s*\**\s*{_NUM}"
               rf"\s*\**\s*(?:/\s*10|out of 10)?", re.I),
    re.compile(rf"\*\*\s*{_NUM}\s*(?:/\s*10)?\s*\*\*"),  # "**8**", "**8/10**"
    re.compile(rf"{_NUM}\s*(?:/\s*10|out of 10)\b", re.I),  # "8/10" anywhere
)


def parse_score(text: str | None) -> float | None:
    """The overall 0-10 score in a judge's answer, clamped to [0, 10]; None if there is none.

    Tried in order: a JSON object with "score" (bare or in a ``` block); the last
    "score: N[/10]"; the last "**N**"; the last "N/10"; the whole answer being one number.
    """
    if not text or not isinstance(text, str):
        return None
    value = None
    for blob in [text.strip(), *re.findall(r"\{[^{}]*\}", text)]:
        try:
            obj = json.loads(blob)
        except ValueError:
            continue
        if (isinstance(obj, dict) and isinstance(obj.get("score"), int | float | str)
                and not isinstance(obj.get("score"), bool)):
            value = obj["score"]
            break
    if value is None:
        for pattern in _PATTERNS:
            found = pattern.findall(text)
            if found:
                value = found[-1]
                break
    if value is None and re.fullmatch(rf"\s*{_NUM}\s*", text):
        value = text
    try:
        score = float(value)
    except (TypeError, ValueError):
        return None
    return None if not math.isfinite(score) else min(max(score, 0.0), 10.0)


@attrs.frozen(kw_only=True)
class JudgeStats:
    """Counters of one judge, for logs and tests."""

    calls: int = 0  # judge() calls
    requests: int = 0  # HTTP requests sent (retries included)
    retries: int = 0
    missing: int = 0  # judge() calls that returned None


class _RetryableError(Exception):
    def __init__(self, why: str, retry_after: float | None = None) -> None:
        super().__init__(why)
        self.retry_after = retry_after


def _retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date), None if absent/unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class HttpJudge:
    """Judge through an OpenAI-compatible `/v1/chat/completions` endpoint (stdlib urllib).

    Each `judge()` call finishes within `timeout_s` (a deadline over all its attempts: every
    socket wait and backoff sleep is capped by the time left). 429, 5xx, connection errors,
    timeouts and unreadable bodies are retried up to `max_retries` times with exponential
    backoff (`backoff_s * 2**attempt`, jittered) or the server's Retry-After when larger;
    other 4xx are not retried. A failed call returns None (missing), never 0.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 timeout_s: float = 30.0, max_retries: int = 4, backoff_s: float = 0.5,
                 temperature: float = 0.0, max_tokens: int = 256) -> None:
        base = base_url.rstrip("/")
        self.url = base + ("/chat/completions" if base.endswith("/v1") else
                           "/v1/chat/completions")
        self.base_url, self.model, self.api_key = base_url, model, api_key
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.temperature, self.max_tokens = temperature, max_tokens
        self._lock = threading.Lock()
        self._stats = JudgeStats()

    @property
    def stats(self) -> JudgeStats:
        return self._stats

    def _count(self, **inc: int) -> None:
        with self._lock:
            self._stats = attrs.evolve(self._stats, **{k: getattr(self._stats, k) + v
                                                       for k, v in inc.items()})

    def config_key(self) -> str:
        return (f"http|{self.url}|{self.model}|t={self.temperature}|n={self.max_tokens}|"
                f"rubric={_rubric_hash()}")

    def judge(self, prompt: str, completion: str) -> float | None:
        """0-10 score of `completion` for `prompt`, or None when the call failed."""
        self._count(calls=1)
        text = self.complete(rubric_messages(prompt, completion))
        score = parse_score(text)
        if score is None:
            self._count(missing=1)
        return score

    def complete(self, messages: list[dict[str, str]]) -> str | None:
        """The assistant's reply text, or None after retries / on a non-retryable error."""
        body = json.dumps({"model": self.model, "messages": messages,
                           "temperature": self.temperature,
                           "max_tokens": self.max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        deadline = time.monotonic() + self.timeout_s
        for attempt in range(self.max_retries + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                self._count(requests=1)
                return self._post(body, headers, left)
            except _RetryableError as err:
                wait = self.backoff_s * 2**attempt * random.uniform(0.5, 1.0)
                if err.retry_after is not None:
                    wait = max(wait, err.retry_after)
                if attempt == self.max_retries or time.monotonic() + wait >= deadline:
                    log.warning("judge call failed (%s); marked missing", err)
                    return None
                self._count(retries=1)
                time.sleep(wait)
            except urllib.error.HTTPError as err:  # other 4xx: our request is wrong
                log.warning("judge call refused: HTTP %d %s", err.code, err.reason)
                return None
        log.warning("judge call ran out of time (%.1f s); marked missing", self.timeout_s)
        return None

    def _post(self, body: bytes, headers: dict[str, str], timeout: float) -> str:
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            if err.code == 429 or err.code >= 500:
                raise _RetryableError(f"HTTP {err.code}",
                                      _retry_after_seconds(err.headers.get("Retry-After"))
                                      ) from None
            raise
        except (urllib.error.URLError, http.client.HTTPException, OSError) as err:  # + timeouts
            raise _RetryableError(f"{type(err).__name__}: {err}") from None
        try:
            return str(json.loads(raw)["choices"][0]["message"]["content"])
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise _RetryableError(f"unreadable response body ({type(err).__name__})") from None


class LocalJudge:
    """Judge with a local causal LM (mlx-lm model definitions and generation).

    `model_path`: anything `mlxio.weights.llm.load_policy` reads (an mlx-lm / HF directory, a GGUF
    file, a hub id, or None for the embedded SmolLM2-135M-Instruct); loaded on first use.
    Generation is greedy and serialised by a lock (one model, many reward threads).
    """

    def __init__(self, model_path: str | None = None, max_tokens: int = 128) -> None:
        self.model_path, self.max_tokens = model_path, max_tokens
        self._policy = None
        self._lock = threading.Lock()

    def config_key(self) -> str:
        return f"local|{self.model_path}|n={self.max_tokens}|rubric={_rubric_hash()}"

    def complete(self, messages: list[dict[str, str]]) -> str:
        from mlx_lm.generate import generate

        with self._lock:
            if self._policy is None:
                from mlxio.weights.llm import load_policy

                self._policy = load_policy(self.model_path)
            tok = self._policy.tokenizer
            prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return generate(self._policy.model, tok, prompt, max_tokens=self.max_tokens)

    def judge(self, prompt: str, completion: str) -> float | None:
        """0-10 score of `completion` for `prompt`, or None when the model gave no score."""
        try:
            text = self.complete(rubric_messages(prompt, completion))
        except (RuntimeError, ValueError) as err:
            log.warning("local judge failed (%s); marked missing", err)
            return None
        return parse_score(text)
