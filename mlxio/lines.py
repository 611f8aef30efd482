"""One JSONL line, read defensively: the checks every data reader shares, so nothing malformed
reaches a tokenizer (a lone surrogate such as "\\ud800" crashes Rust tokenizers; a NUL, an
oversized line or deep nesting is never a real record).

`decode_json_line(raw)` -> the JSON value or `BadLine(reason, message)`; `object_lines(path)`
-> (line number, object) of a JSONL file, DataError on a bad line; `check_text(value,
where)` -> the string or `BadLine`. Reasons: too_long, nul, bom, utf8, too_deep, json,
wrong_type, empty_field, surrogate.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

MAX_LINE_BYTES = 16 * 1024 * 1024  # one record; a longer line is rejected, not read
MAX_DEPTH = 32  # nesting of objects / lists in one line


class BadLine(Exception):
    """A malformed line: `reason` (a short key for lenient counts) and a message naming the field."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # a complete JSON string, escapes and all


def nesting_depth(text: bytes | str) -> int:
    """Deepest [ / { nesting of a JSON text outside strings, in linear time and constant
    stack (vectorised NumPy, no per-character Python loop). Complete strings are cut out
    first; an unterminated one runs to the end of the text, so nothing after its quote counts
    (a closing bracket too many lowers the depth, as a left-to-right count does)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    data = _JSON_STRING.sub(b"", data)
    unterminated = data.find(b'"')
    if unterminated >= 0:
        data = data[:unterminated]
    arr = np.frombuffer(data, np.uint8)
    step = (np.isin(arr, (ord("["), ord("{"))).astype(np.int64)
            - np.isin(arr, (ord("]"), ord("}"))).astype(np.int64))
    return int(np.cumsum(step).max(initial=0))


def decode_json_line(raw: bytes, *, first: bool = False, max_bytes: int = MAX_LINE_BYTES) -> Any:
    """The JSON value of one line (without its newline); raises BadLine."""
    if len(raw) > max_bytes:
        raise BadLine("too_long", f"line of {len(raw)} bytes is longer than {max_bytes}")
    if b"\x00" in raw:
        raise BadLine("nul", "NUL byte in line")
    if first and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 BOM opening the file is harmless (Windows editors write it)
    if b"\xef\xbb\xbf" in raw:
        raise BadLine("bom", "byte-order mark inside the file (concatenated files?)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadLine("utf8", f"invalid UTF-8 at byte {err.start}") from None
    if ("[" in text or "{" in text) and nesting_depth(text) > MAX_DEPTH:
        raise BadLine("too_deep", f"JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, int too long
        raise BadLine("json", f"invalid JSON ({str(err)[:80]})") from None


def object_lines(path: Path, what: str = "JSONL file", max_bytes: int | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line of the JSONL file at `path`; DataError naming
    `path:line` for a line that is not a JSON object (the checks of `decode_json_line`), or
    naming `path` when it cannot be read, is not a regular file or is over `max_bytes`
    (`mlxio.inputs.read_regular`)."""
    from mlxio.errors import DataError
    from mlxio.inputs import MAX_QUERIES_BYTES, read_regular

    raw_lines = read_regular(path, what=what, max_bytes=max_bytes or MAX_QUERIES_BYTES, error=DataError).splitlines()
    for lineno, raw in enumerate(raw_lines, 1):
        if not raw.strip():
            continue
        try:
            row = decode_json_line(raw, first=lineno == 1)
        except BadLine as err:
            raise DataError(f"{path}:{lineno}: {err}") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object")
        yield lineno, row


def check_text(value: object, where: str, *, allow_empty: bool = False) -> str:
    """`value` as a string fit for a tokenizer; raises BadLine naming `where`."""
    if not isinstance(value, str):
        raise BadLine("wrong_type", f"{where}: expected a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise BadLine("empty_field", f"{where}: empty string")
    if "\x00" in value:
        raise BadLine("nul", f"{where}: contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise BadLine("surrogate", f"{where}: lone surrogate {value[err.start]!r} at character {err.start} "
                                   "(not valid Unicode text)") from None
    return value
