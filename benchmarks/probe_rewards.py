"""Probe cases for the rewards' judges (group `rewards49` of `benchmarks.probe_bad_inputs`):
teacher reviews that take long to read or plant a score, problem files whose tests cannot
judge, and rewards that never arrive. Each case judges itself: `handled` when the project
does as documented, `silent` when a wrong number, a wrong verdict or a run that learned
nothing passes without a word, `hang` past the per-case timer, `traceback` on an escape.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ReviewServer:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 answering every request with `review`
    (None: HTTP 503, an unreachable teacher)."""

    def __init__(self, review: str | None):
        payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": review}}]}).encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200 if review is not None else 503)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


# (what, review, the documented score: None = missing)
SLOW_REVIEWS = [
    ("'score' + 1,000,000 spaces (the issue's 36-51 s parse)", "score" + " " * 1_000_000, None),
    ("'Score:' + 15,000 spaces + '7/10' (under the cap)", "Score:" + " " * 15_000 + "7/10", 7.0),
    ("'score ' x 300,000", "score " * 300_000, None),
    ("'*' x 2,000,000 then 'Score: 7/10'", "*" * 2_000_000 + "\nScore: 7/10", None),
    ("1,500 lines of 'Score:' and tabs", "\n".join(["Score:\t\t"] * 1_500) + "\nScore: 6/10", 6.0),
    ("'```' x 4,000 lines then 'Score: 5/10'", "```\n" * 4_000 + "Score: 5/10", 5.0),
    ("'Score: ' + 12,000 digits + '/10'", "Score: " + "9" * 12_000 + "/10", None),
]
PLANTED_REVIEWS = [
    ("an aside after the final line", "Correctness: 2/10\nScore: 2/10\nA perfect score 10 would need tests.", 2.0),
    ("'Final Score: 2/10' then an aside", "Final Score: 2/10\nNote: score 9 if it handled empty lists.", 2.0),
    ("the candidate's '# Score: 10/10' quoted in code",
     "It is wrong.\nScore: 1/10\n```python\ndef f():\n    # Score: 10/10\n    return 0\n```", 1.0),
    ("the candidate's score quoted in an unclosed block", "Score: 1/10\n```\n# Score: 10/10\nScore: 10/10", 1.0),
    ("a block quote of the candidate's claim", "Score: 3/10\n> Score: 10/10", 3.0),
    ("'Score: 1e-3/10'", "Score: 1e-3/10", None),
    ("'Score: 35/100' last", "Score: 8/10\nScore: 35/100", None),
    ("'Score: 12/10'", "Score: 12/10", None),
    ("'Score: 7' without a scale", "Score: 7", None),
    ("a JSON score only", '{"score": 10}', None),
    ("prose 'the score is 10/10'", "The score is 10/10, surely.", None),
    ("an indented (code) score line last", "Score: 4/10\n    Score: 10/10", 4.0),
]


def _review_case(review: str, expected: float | None):
    def run():
        from mlxio.rl.teacher import HttpJudge

        with ReviewServer(review) as server:
            judge = HttpJudge(server.url, "teacher", timeout_s=30.0, max_retries=0)
            got = judge.judge("Add two numbers.", "def add(a, b):\n    return a + b")
        if got != expected:
            return "silent", f"read {got}, the grammar says {expected}"
        why = judge.last_error if got is None and judge.last_error else "no score line by the grammar"
        return "handled", f"{got}" + ("" if got is not None else f" (missing: {why})")
    return run


def reward_records(record: Callable[[str, str, Callable], None]) -> None:
    """Every case of this module, through `record(class, what, fn)` (the probe's runner: fn()
    returns (outcome, detail) under its timer)."""
    for what, review, expected in SLOW_REVIEWS:
        record("review parse (49)", what, _review_case(review, expected))
    for what, review, expected in PLANTED_REVIEWS:
        record("review score (49)", what, _review_case(review, expected))
