"""Probe cases for the rewards' judges (group `rewards49` of `dev.probe_bad_inputs`):
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
from pathlib import Path


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


# ---------------------------------------------------------------- problems without a reference

PROMPT = 'def mean_and_label(xs):\n    """(mean of xs, "high" if it is over 1 else "low")."""\n'
TEST = ("def check(candidate):\n    m, label = candidate([1, 2, 3])\n    assert abs(m - 2.0) < 1e-9\n"
        "    assert label.lower() == 'high'\n    assert candidate([0.5])[1].lower() == 'low'\n")
RIGHT = "```python\ndef mean_and_label(xs):\n    m = sum(xs) / len(xs)\n    return m, 'high' if m > 1 else 'low'\n```"
WRONG = {  # each trips the tests' own code (TypeError, AttributeError, ValueError) rather than an assert
    "returns None": "    return None",
    "returns (mean, None)": "    return sum(xs) / len(xs), None",
    "returns a list": "    return [sum(xs)]",
    "returns a string": "    return 'high'",
    "returns a dict": "    return {'mean': 2.0}",
    "raises ValueError": "    raise ValueError('no')",
}
_CALLS = "    assert candidate([1, 2, 3])[0] == 2.0\n"
UNJUDGEABLE = {
    "tests that raise before the call": "def check(candidate):\n    raise RuntimeError('broken')\n" + _CALLS,
    "tests that hang before the call": "def check(candidate):\n    while True:\n        pass\n" + _CALLS,
    "tests that flood their output": "def check(candidate):\n    while True:\n        print('x' * 10000)\n" + _CALLS,
    "a name error after the call": "def check(candidate):\n    candidate([1])\n    helper_not_defined()\n",
    "tests without an assert": "def check(candidate):\n    candidate([1, 2, 3])\n",
    "tests that swallow every error": "def check(candidate):\n    try:\n    " + _CALLS
                                      + "    except Exception:\n        pass\n",
    "tests that do not load": "def check(candidate)\n" + _CALLS,
    "no check function": "def test(candidate):\n" + _CALLS,
}


def _problem_file(path: Path, tests: dict[str, str]) -> Path:
    path.write_text("".join(json.dumps({"task_id": name, "prompt": PROMPT, "entry_point": "mean_and_label",
                                        "test": test}) + "\n" for name, test in tests.items()))
    return path


def _judge():
    from mlxio.rl.execution import CodeJudge
    from mlxio.sandbox.runner import SandboxLimits

    return CodeJudge(SandboxLimits(timeout_s=3.0, memory_mb=256), workers=2)


def _wrong_answer_case(body: str):
    def run():
        from mlxcore.rl.tasks import Problem
        from mlxio.rl.rewards import ExecutionReward
        from mlxio.sandbox.runner import SandboxLimits

        problem = Problem(task_id="mean", prompt=PROMPT, entry_point="mean_and_label", test=TEST)
        completion = f"```python\ndef mean_and_label(xs):\n{body}\n```"
        reward = ExecutionReward(SandboxLimits(timeout_s=3.0, memory_mb=256), workers=1).score([problem], [completion])
        return ("handled", "reward 0.0") if reward == [0.0] else ("silent", f"reward {reward} for a wrong answer")
    return run


def _pass_at_1_case(work: Path):
    def run():
        from unittest import mock

        from mlxio.rl import evaluation
        from mlxio.rl.problems import read_problems_jsonl

        path = _problem_file(work / "one_of_four.jsonl", {"mean/0": TEST})
        judge = _judge()
        problems = evaluation.judgeable(read_problems_jsonl(path), str(path), judge)
        texts = [RIGHT, *(f"```python\ndef mean_and_label(xs):\n{b}\n```" for b in list(WRONG.values())[:3])]
        cfg = evaluation.EvalConfig(samples=4, greedy=False, resamples=100)
        with mock.patch.object(evaluation, "_decode", lambda policy, ps, c, n, *a: texts[: len(ps) * n]):
            out = evaluation.evaluate(None, problems, cfg, [], None, judge=judge, temperature=1.0)
        got = out["sampled"]["pass@1"]
        return ("handled" if got == 0.25 and not out["sampled"]["missing"] else "silent"), \
            f"pass@1 {got}, missing {out['sampled']['missing']}"
    return run


def _unjudgeable_case(work: Path, name: str):
    def run():
        import logging

        from mlxio.rl import evaluation
        from mlxio.rl.problems import read_problems_jsonl

        path = _problem_file(work / f"{len(list(work.iterdir()))}.jsonl", {"good": TEST, name: UNJUDGEABLE[name]})
        lines: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda r: lines.append(r.getMessage())
        logging.getLogger("mlxio.rl.evaluation").addHandler(handler)
        try:
            kept = evaluation.judgeable(read_problems_jsonl(path), str(path), _judge())
        finally:
            logging.getLogger("mlxio.rl.evaluation").removeHandler(handler)
        named = [line for line in lines if line.startswith(f"{path}:2: problem {name!r} cannot be judged")]
        if [p.task_id for p in kept] == ["good"] and len(named) == 1:
            return "handled", named[0][len(str(path)):][:200]
        return "silent", f"kept {[p.task_id for p in kept]}, lines {lines}"
    return run


# ---------------------------------------------------------------- rewards that never arrive

def _closed_port() -> int:
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def _smoke(work: Path, name: str, *argv: str) -> list[str]:
    return ["--preset", "smoke", "--eval.before", "false", "--out_dir", str(work / name), *argv]


def _teacher_case(cli, work: Path, name: str, review: str | None, *extra: str):
    """The smoke recipe with a teacher that answers `review` (None: 503), or none listening
    (`review` == "closed")."""
    def run():
        if review == "closed":
            return cli("rlaif_qwen", _smoke(work, name, "--teacher.url", f"http://127.0.0.1:{_closed_port()}/v1",
                                           "--teacher.timeout_s", "2", "--teacher.retries", "0", *extra))
        with ReviewServer(review) as server:
            return cli("rlaif_qwen", _smoke(work, name, "--teacher.url", server.url, "--teacher.timeout_s", "5",
                                           "--teacher.retries", "0", *extra))
    return run


def _allow_missing_case(cli, work: Path):
    def run():
        import logging

        said: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda r: said.append(r.getMessage())
        logging.getLogger("rlaif_qwen").addHandler(handler)
        try:
            kind, line = cli("rlaif_qwen", _smoke(work, "allow", "--teacher.url", f"http://127.0.0.1:{_closed_port()}/v1",
                                                  "--teacher.timeout_s", "2", "--teacher.retries", "0",
                                                  "--rewards.allow_missing", "true", "--train.steps", "2",
                                                  "--optim.total_steps", "2", "--eval.after", "false"))
        finally:
            logging.getLogger("rlaif_qwen").removeHandler(handler)
        going_on = [m for m in said if "going on as --rewards.allow_missing asks" in m]
        if kind == "silent" and len(going_on) == 2:  # exit 0 is right here, said at both steps
            return "handled", going_on[-1][:200]
        return ("silent" if kind == "silent" else kind), f"{len(going_on)} lines said it; {line[-200:]}"
    return run


def reward_records(record: Callable[[str, str, Callable], None], work: Path,
                   cli: Callable[[str, list[str]], tuple[str, str]]) -> None:
    """Every case of this module, through `record(class, what, fn)` (the probe's runner: fn()
    returns (outcome, detail) under its timer); `cli(prog, argv)` runs an entry point as the
    probe does, returning (outcome, its last line); `work` is a scratch folder."""
    for what, review, expected in SLOW_REVIEWS:
        record("review parse (49)", what, _review_case(review, expected))
    for what, review, expected in PLANTED_REVIEWS:
        record("review score (49)", what, _review_case(review, expected))
    problems = work / "problems49"
    problems.mkdir()
    record("no reference (49)", "a problem file as documented, 1 right answer of 4: pass@1", _pass_at_1_case(problems))
    for what, body in WRONG.items():
        record("no reference (49)", f"a wrong answer that trips the tests' own code: {what}", _wrong_answer_case(body))
    for name in UNJUDGEABLE:
        record("no reference (49)", f"a problem file with {name}: left out, named", _unjudgeable_case(problems, name))
    nothing = _problem_file(problems / "nothing_judges.jsonl", {k: UNJUDGEABLE[k] for k in list(UNJUDGEABLE)[3:6]})
    record("no reference (49)", "rlaif_qwen --data.problems: no problem's tests can judge",
           lambda: cli("rlaif_qwen", ["--preset", "smoke", "--data.problems", str(nothing),
                                      "--out_dir", str(work / "rlaif49_nothing")]))
    runs = work / "runs49"
    runs.mkdir()
    record("missing rewards (49)", "the teacher unreachable (nothing listens)", _teacher_case(cli, runs, "closed", "closed"))
    record("missing rewards (49)", "the teacher answers 503 every time", _teacher_case(cli, runs, "503", None))
    record("missing rewards (49)", "the teacher's reviews hold no score line",
           _teacher_case(cli, runs, "noscore", "Looks fine to me. 10/10 would be generous."))
    record("missing rewards (49)", "every execution check out of time (--sandbox.timeout_s 0.05)",
           lambda: cli("rlaif_qwen", _smoke(runs, "timeout", "--sandbox.timeout_s", "0.05")))
    record("missing rewards (49)", "--grpo.mask_truncated with every completion cut (max_new_tokens 2)",
           lambda: cli("rlaif_qwen", _smoke(runs, "truncated", "--grpo.mask_truncated", "true", "--max_new_tokens", "2",
                                            "--train.steps", "2", "--optim.total_steps", "2")))
    record("missing rewards (49)", "the teacher unreachable with --rewards.allow_missing: said at every step",
           _allow_missing_case(cli, runs))
