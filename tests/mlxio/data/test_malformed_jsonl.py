"""read_jsonl against generated malformed lines mixed into valid files.

Each example writes 40-60 bad lines (25 examples in the CI profile: >= 1,000 bad lines in
all) of every kind below among valid rows. Strict mode must raise DataError naming the first
bad line's file:line and its field; lenient mode must account for every line (per-reason
counts + accepted rows == lines); nothing but DataError may escape.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from mlxio.data import pairs_jsonl
from mlxio.data.pairs_jsonl import read_jsonl
from mlxio.errors import DataError
from mlxio.lines import MAX_DEPTH

MAX_CHARS = 64
# Texts a valid row may hold: no NUL, no raw BOM, no lone surrogates; non-blank.
TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00\ufeff"),
               min_size=1, max_size=80).filter(lambda s: s.strip() != "")


@st.composite
def valid_row(draw) -> dict:
    row = {"query": draw(TEXT), "code": draw(TEXT)}
    if draw(st.booleans()):
        row["negatives"] = draw(st.lists(TEXT, max_size=3))
    if draw(st.booleans()):
        row["meta"] = draw(st.integers())  # unknown keys are ignored
    return row


def dump(row, ascii_only: bool = True) -> bytes:
    return json.dumps(row, ensure_ascii=ascii_only).encode("utf-8")


def insert(draw, line: bytes, junk: bytes, lo: int = 0) -> bytes:
    at = draw(st.integers(lo, len(line)))
    return line[:at] + junk + line[at:]


def with_field(draw, field: str, value) -> dict:
    row = draw(valid_row())
    row[field] = value
    return row


# kind -> draw -> (line bytes, reason or "blank", field named in the message or None)
def truncated(draw):
    text = dump(draw(valid_row()), ascii_only=False).decode()
    return text[:draw(st.integers(1, len(text) - 1))].encode(), "json", None


def bad_utf8(draw):
    junk = draw(st.sampled_from([b"\xff", b"\xc3(", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80",
                                 b"\xf4\x90\x80\x80", b"\xe2\x82"]))
    return insert(draw, dump(draw(valid_row())), junk), "utf8", None


def mid_bom(draw):
    return insert(draw, dump(draw(valid_row())), b"\xef\xbb\xbf", lo=1), "bom", None


def nul_byte(draw):
    return insert(draw, dump(draw(valid_row())), b"\x00"), "nul", None


def nul_escaped(draw):
    field = draw(st.sampled_from(["query", "code"]))
    return dump(with_field(draw, field, "a\x00b")), "nul", field


def blank(draw):
    return draw(st.sampled_from([b"", b" ", b"\t", b"  \t ", b"\r"])), "blank", None


def wrong_type(draw):
    field = draw(st.sampled_from(["query", "code", "negatives", "source", "name"]))
    value = draw(st.sampled_from([None, 3, 1.5, True, {"a": "b"}, ["x"]]))
    if field == "negatives" and isinstance(value, list):
        value = ["ok", 7]
    row = with_field(draw, field, value)
    return dump(row), "wrong_type", field


def nan_value(draw):
    return b'{"query": NaN, "code": "x"}', "wrong_type", "query"


def empty(draw):
    field = draw(st.sampled_from(["query", "code", "negatives"]))
    value = draw(st.sampled_from(["", " ", "\n\t"]))
    row = with_field(draw, field, [value] if field == "negatives" else value)
    return dump(row), "empty_field", field


def missing(draw):
    field = draw(st.sampled_from(["query", "code"]))
    row = draw(valid_row())
    del row[field]
    return dump(row), "missing_field", field


def not_object(draw):
    return draw(st.sampled_from([b"[1, 2]", b"[]", b'"text"', b"3", b"null", b"true",
                                 b"1.5e3", b'[{"query": "q", "code": "c"}]'])), "not_object", None


def huge(draw):
    # a 1 MB line cut before its closing quote; nested brackets (100k: past RecursionError; or
    # just past MAX_DEPTH, in a field the reader ignores); an int too long to parse
    kind = draw(st.sampled_from(["open", "nested", "nested_field", "bigint"]))
    if kind == "open":
        return b'{"query": "q", "code": "' + b"x" * 1_000_000, "json", None
    if kind == "nested":
        return b"[" * 100_000 + b"]" * 100_000, "too_deep", None
    if kind == "nested_field":
        depth = MAX_DEPTH + draw(st.integers(0, 5))
        return b'{"query": "q", "code": "c", "meta": ' + b"[" * depth + b"]" * depth + b"}", "too_deep", None
    return b'{"query": ' + b"9" * 5000 + b', "code": "x"}', "json", None


def surrogate(draw):
    # a lone surrogate as a JSON escape: valid JSON, valid UTF-8 bytes, not text a tokenizer takes
    field = draw(st.sampled_from(["query", "code", "negatives", "source", "name"]))
    escape = draw(st.sampled_from(["\\ud800", "\\udfff", "\\ud83d", "\\udc00x"]))
    row = with_field(draw, field, ["ok", "SURROGATE"] if field == "negatives" else "SURROGATE")
    return dump(row).replace(b"SURROGATE", escape.encode()), "surrogate", field


BAD = [truncated, bad_utf8, mid_bom, nul_byte, nul_escaped, blank, wrong_type, nan_value,
       empty, missing, not_object, huge, surrogate]


@st.composite
def bad_line(draw):
    return draw(st.sampled_from(BAD))(draw)


@st.composite
def mixed_file(draw):
    """(lines, expected) where expected[i] = (reason, field) or None for a valid row."""
    bad = draw(st.lists(bad_line(), min_size=40, max_size=60))
    good = draw(st.lists(valid_row(), min_size=1, max_size=20))
    items = [(line, (reason, field)) for line, reason, field in bad]
    items += [(dump(row, ascii_only=draw(st.booleans())), None) for row in good]
    order = draw(st.permutations(range(len(items))))
    return [items[i] for i in order]


def write(tmp_path: Path, lines: list[bytes], name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


# No shrinking: a failing 60-line file with 1 MB lines shrinks for many minutes, and the
# assertion messages already name the line at fault.
@settings(max_examples=25, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(data=mixed_file())
def test_mixed_files(tmp_path_factory, data):
    path = write(tmp_path_factory.mktemp("jsonl"), [line for line, _ in data])
    expected = [want for _, want in data]

    pairs, report = read_jsonl(path, lenient=True, max_chars=MAX_CHARS)
    want = Counter(reason for reason, _ in filter(None, expected))
    assert report.skipped == dict(want)
    assert report.accepted == len(pairs) == sum(w is None for w in expected)
    assert report.accepted + sum(report.skipped.values()) == report.lines == len(data)
    assert [p.line for p in pairs] == [i + 1 for i, w in enumerate(expected) if w is None]
    assert all(len(p.query) <= MAX_CHARS and len(p.code) <= MAX_CHARS for p in pairs)

    first_bad = next((i for i, w in enumerate(expected) if w and w[0] != "blank"), None)
    if first_bad is None:
        assert len(read_jsonl(path, max_chars=MAX_CHARS)[0]) == report.accepted
        return
    with pytest.raises(DataError) as err:
        read_jsonl(path, max_chars=MAX_CHARS)
    message = str(err.value)
    assert message.startswith(f"{path}:{first_bad + 1}: ")
    field = expected[first_bad][1]
    if field is not None:
        assert f"field '{field}'" in message


@settings(max_examples=25)
@given(lines=st.lists(st.binary(max_size=40), max_size=30), lenient=st.booleans())
def test_arbitrary_bytes_only_raise_data_error(tmp_path_factory, lines, lenient):
    path = write(tmp_path_factory.mktemp("bytes"), lines)
    try:
        pairs, report = read_jsonl(path, lenient=lenient)
    except DataError as err:
        assert not lenient and str(err).startswith(f"{path}:")
        return
    assert report.accepted + sum(report.skipped.values()) == report.lines


def test_leading_bom_and_line_endings(tmp_path: Path):
    row = b'{"query": "q", "code": "c"}'
    path = write(tmp_path, [b"\xef\xbb\xbf" + row, row + b"\r", b"", row])
    pairs, report = read_jsonl(path)
    assert [p.line for p in pairs] == [1, 2, 4] and report.skipped == {"blank": 1}
    path = write(tmp_path, [row, b"\xef\xbb\xbf" + row], "bom2.jsonl")
    with pytest.raises(DataError, match=r"bom2\.jsonl:2: byte-order mark"):
        read_jsonl(path)


def test_truncation_counted(tmp_path: Path):
    path = write(tmp_path, [json.dumps({"query": "q" * 100, "code": "c", "negatives": ["n" * 9]})
                            .encode(), b'{"query": "q", "code": "c"}'])
    pairs, report = read_jsonl(path, max_chars=8)
    assert report.truncated == 1
    assert (pairs[0].query, pairs[0].negatives) == ("q" * 8, ("n" * 8,))


def test_missing_file_is_data_error(tmp_path: Path):
    with pytest.raises(DataError, match="nope.jsonl"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_oversized_line_rejected_before_parsing(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(pairs_jsonl, "MAX_LINE_BYTES", 100)
    row = b'{"query": "q", "code": "c"}'
    path = write(tmp_path, [row, b'{"query": "q", "code": "' + b"x" * 200 + b'"}', row])
    with pytest.raises(DataError, match=r"data\.jsonl:2: line of 226 bytes is longer than 100"):
        read_jsonl(path)
    pairs, report = read_jsonl(path, lenient=True)
    assert len(pairs) == 2 and report.skipped == {"too_long": 1}


def test_lone_surrogate_never_reaches_the_tokenizer(tmp_path: Path):
    """The issue's case: "\\ud800" is valid JSON and valid UTF-8 bytes, but a tokenizer crashes on it."""
    path = write(tmp_path, [b'{"query": "q", "code": "c"}', b'{"query": "a\\ud800b", "code": "c"}'])
    with pytest.raises(DataError, match=r"data\.jsonl:2: field 'query': lone surrogate"):
        read_jsonl(path)
    pairs, report = read_jsonl(path, lenient=True)
    assert report.skipped == {"surrogate": 1}
    for p in pairs:
        p.query.encode("utf-8"), p.code.encode("utf-8")  # what a tokenizer does first
