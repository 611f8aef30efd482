"""The teacher's review score (`mlxio.rl.review_score`): its written grammar against an
independent regular-expression reading of the same grammar on hypothesis-drawn adversarial
reviews, the last score line deciding, and the work bounded (a cap, one linear pass)."""

from __future__ import annotations

import ast
import inspect
import json
import re
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxio.rl import review_score, teacher
from mlxio.rl.review_score import MAX_REVIEW_CHARS, parse_score
from mlxio.rl.teacher import HttpJudge

# ---------------------------------------------------------------- an independent reading

_OPEN = re.compile(r" {0,3}(`{3,}|~{3,})")
_LABEL = re.compile(r" {0,3}[*_]*(?:(?:final|overall)[ \t]+)?score[ \t*_]*:(.*)", re.I | re.A | re.S)
_VALUE = re.compile(r"[ \t*_]*(\d+(?:\.\d+)?)[ \t]*/[ \t]*10[ \t*_]*(?:\.[ \t*_]*)?", re.A | re.S)


def oracle(text):
    """The grammar of `mlxio.rl.review_score`'s docstring, read with regular expressions
    (fine on the short reviews drawn here)."""
    if not isinstance(text, str) or not text or len(text) > MAX_REVIEW_CHARS:
        return None
    rest, fence = None, None
    for line in text.split("\n"):
        line = line.removesuffix("\r")
        if fence is not None:
            if re.fullmatch(rf" {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*", line):
                fence = None
            continue
        opened = _OPEN.match(line)
        if opened:
            fence = opened.group(1)
            continue
        label = _LABEL.fullmatch(line)
        if label:
            rest = label.group(1)
    value = _VALUE.fullmatch(rest) if rest is not None else None
    if value is None:
        return None
    number = float(value.group(1))
    return number if 0 <= number <= 10 else None


# ---------------------------------------------------------------- examples

@pytest.mark.parametrize("text, expected", [
    ("Score: 7/10", 7.0), ("score: 7.5/10", 7.5), ("SCORE:7/10", 7.0), ("**Score:** 8/10", 8.0),
    ("**Score: 8/10**", 8.0), ("Final Score: 2/10.", 2.0), ("Overall score: 0/10", 0.0), ("Score: 10/10", 10.0),
    ("Correctness: 9/10\nStyle: 5/10\nScore: 7/10", 7.0), ("   Score: 4 / 10  ", 4.0), ("Score: 6/10\r\n", 6.0),
    # the cases: the final score line decides, asides and quoted code do not
    ("Final Score: 2/10\nA perfect score 10 would need tests and docs.", 2.0),
    ("Score: 3/10\n```python\ndef f():\n    pass\n# Score: 10/10\n```", 3.0),
    ("Score: 3/10\n~~~~\nScore: 10/10\n~~~~\nthanks", 3.0),
    ("Score: 3/10\n```\nScore: 10/10", 3.0),  # an unclosed block runs to the end
    ("Score: 3/10\n> Score: 10/10", 3.0), ("Score: 3/10\n# Score: 10/10", 3.0),
    ("Score: 3/10\n    Score: 10/10", 3.0),  # indented code
    ("Score: 1e-3/10", None), ("Score: 1E1/10", None), ("Score: nan/10", None), ("Score: -0/10", None),
    ("Score: +5/10", None), ("Score: 5.", None), ("Score: 7", None), ("Score: 7/10 (generous)", None),
    # another scale or out of range is missing, never clamped; an earlier line never stands in
    ("Score: 35/100", None), ("Score: 11/10", None), ("Score: 10.5/10", None), ("Score: 3/5", None),
    ("Score: 8/10\nFinal score: 35/100", None), ("Score: 8/10\nScore: 9/100", None),
    # no score line at all
    ("7.5", None), ('{"score": 6}', None), ("The final score is **9/10**", None), ("I give it 6 out of 10.", None),
    ("junk", None), ("", None), (None, None), ("Scoreboard: 7/10", None), ("finalscore: 7/10", None),
    ("Score: 7/100", None), ("Score: 7/10/10", None), ("Score: 07/10", 7.0), ("Score: 1_0/10", None),
])
def test_examples(text, expected):
    assert parse_score(text) == expected
    assert oracle(text) == expected


# ---------------------------------------------------------------- adversarial reviews

_GOOD = st.builds(lambda n, label, spaces: f"{label}{spaces}{n}/10",
                  st.one_of(st.integers(0, 10).map(str), st.decimals(0, 10, places=2).map(str)),
                  st.sampled_from(["Score: ", "Final Score: ", "**Score:** ", "score:", "Overall Score : "]),
                  st.sampled_from(["", " ", "  \t "]))
_BAD_SCORE = st.sampled_from(["Score: 1e-3/10", "Score: 35/100", "Score: 12/10", "Score: 9", "Score: -1/10",
                              "Score: 10/10 would be generous", "Score: ten/10", "Score: 5/10/10"])
_ASIDE = st.sampled_from([
    "A perfect score 10 would need tests.", "score 10/10 for effort", "The score is 10/10.",
    '{"score": 10}', "10/10", "> Score: 10/10", "# Score: 10/10", "    Score: 10/10", "\tScore: 10/10",
    "Scores: 10/10", "Thanks!", "", "Correctness: 10/10", "*" * 40, "score" + " " * 300 + "10/10",
])
_CODE = st.builds(lambda fence, body, close: f"{fence}python\n{body}\n{close}",
                  st.sampled_from(["```", "````", "~~~", "  ```"]),
                  st.sampled_from(["# Score: 10/10", "print('Score: 10/10')", "Score: 10/10\nScore: 9/10"]),
                  st.sampled_from(["```", "````", "~~~", "``` ", " ```"]))
_LINE = st.one_of(_GOOD, _BAD_SCORE, _ASIDE, _CODE, st.text(max_size=60))


@settings(max_examples=300)
@given(st.lists(_LINE, max_size=12), st.sampled_from(["\n", "\r\n"]))
def test_any_review_reads_as_the_grammar_says(lines, newline):
    review = newline.join(lines)
    assert parse_score(review) == oracle(review)


@settings(max_examples=200)
@given(st.lists(st.one_of(_ASIDE, _CODE, _GOOD, _BAD_SCORE), max_size=6), st.integers(0, 10),
       st.lists(st.one_of(_ASIDE, _CODE), max_size=6))
def test_the_last_score_line_decides_whatever_follows(before, final, after):
    """Asides and quoted code after the final score line, and any score lines before it,
    leave the final one standing (the issue's "Final Score: 2/10" + an aside read 9)."""
    review = "\n".join([*before, "", f"Final Score: {final}/10", *after])
    swallowed = parse_score("\n".join([*before, "", "Score: 0.123/10"])) != 0.123  # by a code block left open
    assert parse_score(review) == (parse_score("\n".join(before)) if swallowed else float(final))


@given(_BAD_SCORE, st.lists(_ASIDE, max_size=4))
def test_a_last_score_line_off_the_grammar_is_missing(bad, asides):
    assert parse_score("\n".join(["Score: 8/10", bad, *asides])) is None


@given(st.text(max_size=300))
def test_never_raises_and_stays_in_range(text):
    score = parse_score(text)
    assert score is None or 0.0 <= score <= 10.0
    assert score == oracle(text)


# ---------------------------------------------------------------- bounded work

def test_the_grammar_is_read_without_regular_expressions():
    tree = ast.parse(inspect.getsource(review_score))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
                for a in n.names} | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"annotations", "__future__"}  # no re, no parser library: plain str methods


def test_a_review_over_the_cap_is_not_read():
    assert parse_score("Score: 7/10" + " " * (MAX_REVIEW_CHARS - 11)) == 7.0
    assert parse_score("Score: 7/10" + " " * (MAX_REVIEW_CHARS - 10)) is None


_PATHOLOGICAL = st.sampled_from([
    "score" + " " * 5000, "Score:" + " " * 5000 + "7", "score " * 2000, "*" * 8000 + "score:",
    "\n" * 8000, "```\n" * 2000, "Score: " + "9" * 8000 + "/10", "Score: 1." + "0" * 8000 + "/10",
    "Final" + "\t" * 8000 + "score: 1/10", "Score:" + " *" * 4000 + "5/10", "   " * 3000 + "Score: 1/10",
])


@settings(max_examples=60)
@given(st.lists(_PATHOLOGICAL, min_size=1, max_size=4).map("\n".join))
def test_work_is_linear_in_the_review(review):
    """Every character a line's reading looks at goes through `_skip` (plus slices of at most
    8 characters): count them. Long runs of whitespace, emphasis, digits and fences cost a
    few looks per character, never a product of run lengths (the issue's regex: 36-51 s)."""
    review = review[:MAX_REVIEW_CHARS]
    looks = 0
    real_skip = review_score._skip

    def counted(line, i, chars):
        nonlocal looks
        end = real_skip(line, i, chars)
        looks += end - i + 1
        return end

    review_score._skip = counted
    try:
        parse_score(review)
    finally:
        review_score._skip = real_skip
    lines = review.count("\n") + 1
    assert looks <= 4 * len(review) + 16 * lines


# ---------------------------------------------------------------- inside the judge's deadline

class _ReviewServer:
    """An OpenAI-style endpoint answering every request with `review`."""

    def __init__(self, review: str):
        payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": review}}]}).encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_review_over_the_cap_is_missing_with_its_reason():
    with _ReviewServer("score" + " " * 2_000_000 + ": 9/10\nScore: 9/10") as server:
        judge = HttpJudge(server.url, "teacher", timeout_s=30.0)
        assert judge.judge("p", "c") is None
    assert judge.stats.missing == 1 and "over the 16384-character limit" in judge.last_error


def test_a_score_read_after_the_deadline_is_missing(monkeypatch):
    """The parse runs inside the call's deadline: a clock that passes the deadline while the
    review is read (the issue's 36-51 s parse) makes the score missing, counted as a deadline."""
    clock = [0.0]
    monkeypatch.setattr(teacher, "time", types.SimpleNamespace(monotonic=lambda: clock[0], sleep=time.sleep,
                                                               time=time.time))

    def slow_parse(review):
        clock[0] += 31.0  # the parse took longer than the 30 s deadline
        return 9.0

    monkeypatch.setattr(teacher, "parse_score", slow_parse)
    with _ReviewServer("Score: 9/10") as server:
        judge = HttpJudge(server.url, "teacher", timeout_s=30.0)
        assert judge.judge("p", "c") is None
    assert judge.stats.deadlines == 1 and judge.stats.missing == 1
    monkeypatch.setattr(teacher, "parse_score", review_score.parse_score)
    with _ReviewServer("Score: 9/10\nA perfect score 10 would need docs.") as server:
        assert HttpJudge(server.url, "teacher", timeout_s=30.0).judge("p", "c") == 9.0


def test_the_guide_states_the_cap_of_the_code():
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[3] / "docs" / "rlaif.md").read_text()
    assert f"review over {MAX_REVIEW_CHARS:,} characters has no score" in guide
