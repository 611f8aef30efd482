"""AI-feedback judges: a rubric prompt, a robust score parser and the HTTP judge (the local
judge and the local teacher server: `mlxio.rl.local_teacher`).

A judge has `judge(prompt, completion) -> float | None` (a 0-10 score, None = missing: the
call failed or the answer held no score; never 0) and `config_key() -> str` (what changes its
scores; part of reward-cache keys).

Two ways to read a score from the teacher (`scoring`):
- "text": the teacher writes its review and a last line `Score: N/10`; `parse_score`
  (`mlxio.rl.review_score`: its grammar, linear and capped) reads it. For capable teachers.
- "verdict": the teacher is asked, after the same rubric, whether the solution is correct
  ("Yes" / "No") and the score is 10 * P(yes) / (P(yes) + P(no)) from the log-probabilities
  of its first answer token (OpenAI `logprobs` / `top_logprobs`; a local judge reads its
  logits). One token per call, and a graded score even from a small model that never writes a
  `Score:` line (SmolLM2-135M does not).

Every call has one deadline (`timeout_s`) over everything it does: connecting, sending,
waiting for the headers, reading the body, retries and their back-off (HTTP), or waiting for
the model and generating (local). A teacher that answers too slowly, drips its body, or never
ends it gives a missing reward when the deadline passes - the call never hangs.
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
import socket
import threading
import time
import urllib.parse

import attrs

from mlxio.lines import nesting_depth
from mlxio.redact import redact_text
from mlxio.rl.review_score import MAX_REVIEW_CHARS, parse_score

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
VERDICT_USER = ("## Task\n{prompt}\n\n## Candidate solution\n{completion}\n\n"
                "Is the candidate solution correct? Answer with one word: Yes or No.")
SCORINGS = ("text", "verdict")

MAX_RESPONSE_BYTES = 1 << 22  # 4 MiB: a chat answer of a few hundred tokens is a few KiB
MAX_JSON_DEPTH = 64  # an OpenAI chat response nests 6 deep
PREFILL_CHUNK = 16  # a local judge reads its prompt in chunks of this many tokens, checking the
# deadline between them (on a busy CPU a rubric prompt alone can take longer than a deadline)


def rubric_messages(prompt: str, completion: str, scoring: str = "text"
                    ) -> list[dict[str, str]]:
    """Chat messages asking a judge to grade `completion` for `prompt` with the rubric
    (`scoring` "verdict": ending in the yes/no question instead of "Grade it.")."""
    user = VERDICT_USER if scoring == "verdict" else RUBRIC_USER
    return [{"role": "system", "content": RUBRIC_SYSTEM},
            {"role": "user", "content": user.format(prompt=prompt, completion=completion)}]


def rubric_hash(scoring: str = "text") -> str:
    user = VERDICT_USER if scoring == "verdict" else RUBRIC_USER
    return hashlib.sha256((RUBRIC_SYSTEM + user).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- bounded JSON

def loads_bounded(raw: bytes | str, max_depth: int = MAX_JSON_DEPTH):
    """`json.loads` that refuses (ValueError) text nested deeper than `max_depth` before it
    parses anything, so parsing never recurses without bound."""
    if nesting_depth(raw) > max_depth:
        raise ValueError(f"JSON nested deeper than {max_depth}")
    try:
        return json.loads(raw)
    except RecursionError:  # belt and braces: the depth scan is an upper bound already
        raise ValueError("JSON nested too deep") from None


# ---------------------------------------------------------------- verdict tokens

def answer_word(token: str) -> str:
    """A yes/no answer token normalised: case, punctuation and spacing dropped (" Yes",
    "No.", "**yes**", "▁no" -> "yes" / "no")."""
    return re.sub(r"[\W_]+", "", str(token)).lower()


MIN_ANSWER_MASS = 0.5  # below this much probability on "yes" + "no" the judge gave no verdict


def verdict_score(p_yes: float, p_no: float) -> float | None:
    """10 * (P(yes) + P(neither) / 2): the probability mass on neither answer is uncertainty
    (half a point), never yes; None when yes and no together hold less than MIN_ANSWER_MASS
    (the judge did not answer the question)."""
    if not (math.isfinite(p_yes) and math.isfinite(p_no)) or p_yes < 0 or p_no < 0:
        return None
    answered = p_yes + p_no
    if answered < MIN_ANSWER_MASS:
        return None
    neither = max(0.0, 1.0 - answered)
    return min(10.0, 10.0 * (p_yes + 0.5 * neither))


def _verdict_from_response(resp: dict) -> float | None:
    """The verdict score of an OpenAI chat response with `logprobs` (the first answer token's
    top log-probs, each token normalised by `answer_word`; mass on other tokens, listed or
    not, is neither answer); else from the answer text's first word; None when neither says
    yes or no."""
    choice = resp["choices"][0]
    content = (choice.get("logprobs") or {}).get("content") or []
    if content and isinstance(content[0], dict):
        tops = content[0].get("top_logprobs") or [content[0]]
        p = {"yes": 0.0, "no": 0.0}
        for entry in tops:
            word = answer_word(entry.get("token", "")) if isinstance(entry, dict) else ""
            logprob = entry.get("logprob") if isinstance(entry, dict) else None
            if word in p and isinstance(logprob, int | float) and not isinstance(logprob, bool):
                p[word] += math.exp(min(float(logprob), 0.0))
        return verdict_score(p["yes"], p["no"])
    text = choice.get("message", {}).get("content")
    first = re.match(r"\W*(\w+)", text) if isinstance(text, str) else None
    word = first.group(1).lower() if first else ""
    return 10.0 if word == "yes" else 0.0 if word == "no" else None


# ---------------------------------------------------------------- HTTP judge

@attrs.frozen(kw_only=True)
class JudgeStats:
    """Counters of one judge, for logs and tests."""

    calls: int = 0  # judge() calls
    requests: int = 0  # HTTP requests sent (retries included)
    retries: int = 0
    missing: int = 0  # judge() calls that returned None
    deadlines: int = 0  # calls that ran out of time


class _RetryableError(Exception):
    def __init__(self, why: str, retry_after: float | None = None) -> None:
        super().__init__(why)
        self.retry_after = retry_after


class _FatalError(Exception):
    """Not worth retrying: our request was refused (4xx) or the answer is too large."""


class _DeadlineError(Exception):
    pass


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
    except (TypeError, ValueError, OverflowError):
        return None


def _abort(conn: http.client.HTTPConnection) -> None:
    """Deadline watchdog: shut the socket down, so a blocked connect/send/recv returns now."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class HttpJudge:
    """Judge through an OpenAI-compatible `/v1/chat/completions` endpoint (stdlib http.client).

    Each `judge()` call finishes within `timeout_s`, one deadline over all it does: connect,
    send, headers, body, retries and back-off sleeps (a watchdog shuts the socket down when the
    deadline passes, so a server that drips its body one byte at a time or never ends a chunked
    body cannot stretch it; only the DNS look-up of a host name is outside it). Answers larger
    than `max_response_bytes` are refused, and the JSON is depth-checked before it is parsed.
    429, 5xx, connection errors and unreadable bodies are retried up to `max_retries` times
    with exponential backoff (`backoff_s * 2**attempt`, jittered) or the server's Retry-After
    when larger; other 4xx are not retried. A failed call returns None (missing), never 0, and
    logs one line saying why; `last_error` holds it.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 timeout_s: float = 30.0, max_retries: int = 4, backoff_s: float = 0.5,
                 temperature: float = 0.0, max_tokens: int = 256, scoring: str = "text",
                 max_response_bytes: int = MAX_RESPONSE_BYTES) -> None:
        base = base_url.rstrip("/")
        self.url = base + ("/chat/completions" if base.endswith("/v1") else
                           "/v1/chat/completions")
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"teacher url {redact_text(base_url)!r}: expected http://host[:port][/v1]")
        if scoring not in SCORINGS:
            raise ValueError(f"scoring {scoring!r}: expected one of {SCORINGS}")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self._parts = parts
        self.base_url, self.model, self.api_key = base_url, model, api_key
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.temperature, self.max_tokens, self.scoring = temperature, max_tokens, scoring
        self.max_response_bytes = max_response_bytes
        self.last_error: str | None = None
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
        tokens = 1 if self.scoring == "verdict" else self.max_tokens
        return (f"http|{self.url}|{self.model}|t={self.temperature}|n={tokens}|"
                f"scoring={self.scoring}|rubric={rubric_hash(self.scoring)}")

    def judge(self, prompt: str, completion: str) -> float | None:
        """0-10 score of `completion` for `prompt`, or None when the call failed. The answer
        is read (its score parsed) within the call's deadline too: a score known only after
        it is missing."""
        self._count(calls=1)
        deadline = time.monotonic() + self.timeout_s
        messages = rubric_messages(prompt, completion, self.scoring)
        if self.scoring == "verdict":
            resp = self.request(messages, max_tokens=1, logprobs=True, top_logprobs=10, deadline=deadline)
            try:
                score = None if resp is None else _verdict_from_response(resp)
            except (KeyError, IndexError, TypeError, AttributeError, ValueError):
                score = None
        else:
            score = self._review_score(self.complete(messages, deadline))
        if score is not None and time.monotonic() >= deadline:
            score = self._fail(f"answer read after the {self.timeout_s:g} s deadline", deadline=True)
        if score is None:
            self._count(missing=1)
        return score

    def _review_score(self, review: str | None) -> float | None:
        """`parse_score` of a text review; a review over MAX_REVIEW_CHARS is refused unread."""
        if review is not None and len(review) > MAX_REVIEW_CHARS:
            return self._fail(f"review of {len(review)} characters is over the {MAX_REVIEW_CHARS}-character "
                              "limit (the rubric asks for a few lines)")
        return parse_score(review)

    def complete(self, messages: list[dict[str, str]], deadline: float | None = None) -> str | None:
        """The assistant's reply text, or None after retries / on a non-retryable error."""
        resp = self.request(messages, deadline=deadline)
        if resp is None:
            return None
        try:
            return str(resp["choices"][0]["message"]["content"])
        except (KeyError, IndexError, TypeError):
            return None

    def request(self, messages: list[dict[str, str]], deadline: float | None = None, **extra) -> dict | None:
        """The parsed JSON answer of one chat request (with retries, by `deadline`,
        time.monotonic(); default `timeout_s` from now), or None (the reason logged and kept
        in `last_error`)."""
        payload = {"model": self.model, "messages": messages, "temperature": self.temperature,
                   "max_tokens": self.max_tokens, **extra}
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        deadline = time.monotonic() + self.timeout_s if deadline is None else deadline
        attempt = 0
        while True:
            try:
                self._count(requests=1)
                return self._post(body, headers, deadline)
            except _RetryableError as err:
                wait = self.backoff_s * 2**attempt * random.uniform(0.5, 1.0)
                if err.retry_after is not None:
                    wait = max(wait, err.retry_after)
                if attempt == self.max_retries:
                    return self._fail(f"{err}, after {attempt + 1} attempts")
                if time.monotonic() + wait >= deadline:
                    return self._fail(f"{err}; no time left for a retry within "
                                      f"{self.timeout_s:g} s", deadline=True)
                self._count(retries=1)
                time.sleep(wait)
                attempt += 1
            except _FatalError as err:
                return self._fail(str(err))
            except _DeadlineError as err:
                return self._fail(str(err), deadline=True)

    def _fail(self, why: str, deadline: bool = False) -> None:
        self.last_error = f"teacher {redact_text(self.url)}: {redact_text(why)}"
        if deadline:
            self._count(deadlines=1)
        log.warning("%s; reward marked missing", self.last_error)
        return None

    def _post(self, body: bytes, headers: dict[str, str], deadline: float) -> dict:
        """One request, finished or abandoned by `deadline` (time.monotonic())."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise _DeadlineError(f"no answer within the {self.timeout_s:g} s deadline")
        parts = self._parts
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname, parts.port, timeout=left)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        watchdog = threading.Timer(left, _abort, (conn,))
        watchdog.daemon = True
        try:
            watchdog.start()  # before connect: a TLS handshake is covered too
            conn.connect()  # the TCP connect itself is bounded by `timeout=left`
            conn.request("POST", path, body=body, headers=headers)
            resp = conn.getresponse()
            if resp.status == 429 or resp.status >= 500:
                raise _RetryableError(f"HTTP {resp.status} {resp.reason}",
                                      _retry_after_seconds(resp.getheader("Retry-After")))
            if resp.status != 200:
                raise _FatalError(f"HTTP {resp.status} {resp.reason} (not retried: fix the "
                                  "request, e.g. --teacher.model or the url)")
            raw = self._read_body(resp, deadline)
        except (OSError, http.client.HTTPException) as err:  # timeouts, resets, aborts
            if time.monotonic() >= deadline:
                raise _DeadlineError(f"no complete answer within the {self.timeout_s:g} s "
                                     f"deadline ({type(err).__name__})") from None
            raise _RetryableError(f"{type(err).__name__}: {err}") from None
        finally:
            watchdog.cancel()
            conn.close()
        try:
            resp_json = loads_bounded(raw)
        except (ValueError, UnicodeDecodeError) as err:
            raise _RetryableError(f"unreadable response body ({err})") from None
        if not isinstance(resp_json, dict) or not isinstance(resp_json.get("choices"), list) \
                or not resp_json["choices"] or not isinstance(resp_json["choices"][0], dict):
            raise _RetryableError("response without choices")
        return resp_json

    def _read_body(self, resp: http.client.HTTPResponse, deadline: float) -> bytes:
        length = resp.getheader("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_response_bytes:
            raise _FatalError(f"answer of {int(length)} bytes is over the "
                              f"{self.max_response_bytes}-byte limit")
        chunks, size = [], 0
        while True:
            if time.monotonic() >= deadline:
                raise _DeadlineError(f"answer not complete within the {self.timeout_s:g} s "
                                     f"deadline ({size} bytes read)")
            chunk = resp.read1(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > self.max_response_bytes:
                raise _FatalError(f"answer over the {self.max_response_bytes}-byte limit")
            chunks.append(chunk)
        if time.monotonic() >= deadline:  # the watchdog ended the read: the body is cut short
            raise _DeadlineError(f"answer not complete within the {self.timeout_s:g} s "
                                 f"deadline ({size} bytes read)")
        if length is not None and length.strip().isdigit() and size < int(length):
            raise _RetryableError(f"answer cut short ({size} of {int(length)} bytes)")
        return b"".join(chunks)
