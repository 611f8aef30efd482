"""User (query, code) pairs from JSONL, read strictly: a malformed line raises `DataError` naming
`file:line` and the field, or (lenient) is skipped and counted by reason."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import attrs

from mlxio.atomic import write_text_atomic
from mlxio.data.pairs import Pair
from mlxio.errors import DataError
from mlxio.inputs import MAX_DATA_BYTES, read_regular
from mlxio.lines import MAX_LINE_BYTES, BadLine, check_text, decode_json_line


@attrs.frozen(kw_only=True)
class JsonlReport:
    """What `read_jsonl` saw: `lines` = `accepted` + sum(`skipped`.values()); `truncated`
    counts accepted rows with a text cut to max_chars; `errors` the first few messages."""

    lines: int
    accepted: int
    skipped: dict[str, int]
    truncated: int
    errors: tuple[str, ...]


def _text_field(row: dict, field: str) -> str:
    if field not in row:
        raise BadLine("missing_field", f"field {field!r}: missing")
    return check_text(row[field], f"field {field!r}")


def _parse_line(raw: bytes, first: bool) -> dict:
    """One JSONL line -> Pair fields (query, code, negatives, maybe source and name);
    raises BadLine(reason, message)."""
    row = decode_json_line(raw, first=first, max_bytes=MAX_LINE_BYTES)
    if not isinstance(row, dict):
        raise BadLine("not_object", f"expected a JSON object, got {type(row).__name__}")
    query, code = _text_field(row, "query"), _text_field(row, "code")
    negatives = row.get("negatives", [])
    if not isinstance(negatives, list):
        raise BadLine("wrong_type", f"field 'negatives': expected a list, got "
                                    f"{type(negatives).__name__}")
    negs = tuple(check_text(n, f"field 'negatives'[{i}]") for i, n in enumerate(negatives))
    out = {"query": query, "code": code, "negatives": negs}
    if "source" in row:
        out["source"] = _text_field(row, "source")
    if "name" in row:
        out["name"] = check_text(row["name"], "field 'name'", allow_empty=True)
    else:
        out["name"] = ""
    return out


def read_jsonl(path: Path | str, lenient: bool = False,
               max_chars: int = 20_000) -> tuple[list[Pair], JsonlReport]:
    """Pairs from a JSONL file of {"query": str, "code": str, "negatives"?: [str, ...],
    "source"?: str, "name"?: str}.

    `source` names the file the code came from, which `split_by_file` keeps on one side; a
    row without it gets "<jsonl path>:<line>" (its own group). `Pair.line` is the JSONL line.

    Blank lines are skipped (counted as "blank"). A malformed line raises DataError naming
    `file:line` and the field, or with `lenient=True` is skipped and counted by reason
    (utf8, bom, nul, json, not_object, missing_field, empty_field, wrong_type, surrogate,
    too_long: a line over MAX_LINE_BYTES, too_deep: JSON nested deeper than
    `mlxio.lines.MAX_DEPTH`); nothing malformed reaches a tokenizer. Texts longer
    than `max_chars` are truncated (counted). Other keys are ignored.
    """
    path = Path(path)
    data = read_regular(path, what="data file", max_bytes=MAX_DATA_BYTES,
                        fix="pass a JSONL file of pairs to --data.source")
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the final newline ends the last line; it opens no new one
    pairs: list[Pair] = []
    skipped: Counter[str] = Counter()
    errors: list[str] = []
    truncated = 0
    for lineno, raw in enumerate(raw_lines, start=1):
        raw = raw.removesuffix(b"\r")
        if not raw.strip(b" \t") or (lineno == 1 and raw == b"\xef\xbb\xbf"):
            skipped["blank"] += 1
            continue
        try:
            fields = _parse_line(raw, lineno == 1)
        except BadLine as bad:
            message = f"{path}:{lineno}: {bad}"
            if not lenient:
                raise DataError(message, fix="fix or remove that line (--data.lenient true skips bad lines, "
                                             "counted by reason)") from None
            skipped[bad.reason] += 1
            if len(errors) < 10:
                errors.append(message)
            continue
        texts = (fields["query"], fields["code"], *fields["negatives"])
        if any(len(t) > max_chars for t in texts):
            truncated += 1
            for key in ("query", "code"):
                fields[key] = fields[key][:max_chars]
            fields["negatives"] = tuple(n[:max_chars] for n in fields["negatives"])
        fields.setdefault("source", f"{path}:{lineno}")
        pairs.append(Pair(line=lineno, **fields))
    report = JsonlReport(lines=len(raw_lines), accepted=len(pairs), skipped=dict(skipped),
                         truncated=truncated, errors=tuple(errors))
    return pairs, report


def write_jsonl(path: Path | str, pairs: Iterable[Pair]) -> None:
    """Write pairs as JSONL that `read_jsonl` reads back (source/line/name kept as extras)."""
    lines = []
    for p in pairs:
        row = {"query": p.query, "code": p.code, "source": p.source, "line": p.line, "name": p.name}
        if p.negatives:
            row["negatives"] = list(p.negatives)
        lines.append(json.dumps(row, ensure_ascii=False) + "\n")
    write_text_atomic(Path(path), "".join(lines), "pairs file")
