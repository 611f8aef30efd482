"""The score in a teacher's review: one written grammar, read in one pass without regular
expressions, so the work is linear in the review's length and the length is capped.

Grammar (what `parse_score` accepts; anything else is no score, a missing reward):

- A review longer than `MAX_REVIEW_CHARS` characters has no score (it is not read).
- Lines end at "\\n" (a "\\r" just before it is dropped).
- Code blocks are not read. A *fence* is a line of at most 3 leading spaces, then 3 or more
  backticks or tildes; it opens a code block that the next fence of the same character, at
  least as long and followed by nothing but spaces, closes. A block left open runs to the end
  of the review. Fences themselves are inside the block.
- A *score line* is a line outside code blocks that starts (after at most 3 spaces and any
  `*` / `_` emphasis) with `Score`, or `Final Score` / `Overall Score`, then optional spaces
  and emphasis, then `:` (the case of these ASCII letters is ignored). The review's LAST score line decides: it scores N
  when the rest of that line is, emphasis and spaces aside, `N/10` with N a plain decimal
  number (digits, optionally "." and digits: no sign, exponent, "nan" or thousands separator)
  in [0, 10], followed by nothing but spaces, emphasis or one ".". A last score line that
  says anything else ("Score: 35/100", "Score: 1e-3/10", "Score: 7", "Score: 12/10") gives
  no score: an earlier score line never stands in for it.
- Everything else is prose and claims nothing: asides after the score line ("a perfect score
  10 would need ..."), quoted code (`# Score: 10/10` inside a block), block quotes
  (`> Score: 10/10`), headings, JSON, bare numbers.
"""

from __future__ import annotations

MAX_REVIEW_CHARS = 16_384  # ~4,000 tokens; the rubric's answer is a few lines (max_tokens 256)
MAX_INDENT = 3  # 4 spaces or more make an indented code line (Markdown), never a score line
_SPACE = " \t"
_EMPHASIS = "*_"
_QUALIFIERS = ("final", "overall")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")  # case of ASCII letters only


def _skip(line: str, i: int, chars: str) -> int:
    """The first index >= i of `line` whose character is not in `chars` (len(line) if none)."""
    n = len(line)
    while i < n and line[i] in chars:
        i += 1
    return i


def _indent(line: str) -> int | None:
    """Index after the line's leading spaces, or None when they are more than MAX_INDENT (or
    a tab: an indented code line)."""
    i = _skip(line, 0, " ")
    if i > MAX_INDENT or line[i:i + 1] == "\t":
        return None
    return i


def _fence(line: str) -> tuple[str, int] | None:
    """(character, length) when `line` is a fence (see the module doc), else None."""
    i = _indent(line)
    if i is None or i >= len(line) or line[i] not in "`~":
        return None
    mark = line[i]
    end = _skip(line, i, mark)
    return (mark, end - i) if end - i >= 3 else None


def _closes(line: str, opened: tuple[str, int]) -> bool:
    """Whether `line` closes a block opened by the fence `opened` (same character, at least as
    long, nothing but spaces after it)."""
    found = _fence(line)
    if found is None or found[0] != opened[0] or found[1] < opened[1]:
        return False
    i = _indent(line) or 0
    return _skip(line, _skip(line, i, opened[0]), _SPACE) == len(line)


def _after_label(line: str) -> int | None:
    """Index just past the `:` of a score line's label (`Score:`, `Final Score:`, ...), or
    None when `line` is not a score line."""
    i = _indent(line)
    if i is None:
        return None
    i = _skip(line, i, _EMPHASIS)
    lower = line[i:i + 8].translate(_ASCII_LOWER)
    for word in _QUALIFIERS:
        if lower.startswith(word):
            after = _skip(line, i + len(word), _SPACE)
            if after > i + len(word):  # "final score", never "finalscore"
                i = after
                lower = line[i:i + 5].translate(_ASCII_LOWER)
            break
    if not lower.startswith("score"):
        return None
    i = _skip(line, i + 5, _SPACE + _EMPHASIS)
    return i + 1 if line[i:i + 1] == ":" else None


def _digits(text: str, i: int) -> int:
    return _skip(text, i, "0123456789")


def _score_of(line: str, i: int) -> float | None:
    """The N of `N/10` that the rest of a score line (from index i, past its `:`) must be, or
    None when it is anything else."""
    i = _skip(line, i, _SPACE + _EMPHASIS)
    end = _digits(line, i)
    if end == i:
        return None
    if line[end:end + 1] == ".":
        frac = _digits(line, end + 1)
        if frac == end + 1:
            return None
        end = frac
    number = line[i:end]
    i = _skip(line, end, _SPACE)
    if line[i:i + 1] != "/":
        return None
    i = _skip(line, i + 1, _SPACE)
    if line[i:i + 2] != "10" or _digits(line, i) != i + 2:
        return None
    i = _skip(line, i + 2, _SPACE + _EMPHASIS)
    if line[i:i + 1] == ".":
        i = _skip(line, i + 1, _SPACE + _EMPHASIS)
    if i != len(line):
        return None
    value = float(number)  # digits and one point: a finite float (inf past 1e308: out of range)
    return value if 0.0 <= value <= 10.0 else None


def parse_score(text: str | None) -> float | None:
    """The 0-10 score of a teacher's review by the grammar of this module's docstring (the
    last `Score: N/10` line outside code blocks), or None (missing) when it gives none: no
    score line, a last score line that is not a plain N/10 in [0, 10], or a review over
    MAX_REVIEW_CHARS. One pass over the lines, each character looked at a bounded number of
    times (no regular expression, no backtracking)."""
    if not isinstance(text, str) or not text or len(text) > MAX_REVIEW_CHARS:
        return None
    last: tuple[str, int] | None = None  # the last score line and where its value starts
    opened: tuple[str, int] | None = None  # the fence of the code block we are in
    for line in text.split("\n"):
        line = line.removesuffix("\r")
        if opened is not None:
            if _closes(line, opened):
                opened = None
            continue
        opened = _fence(line)
        if opened is not None:
            continue
        start = _after_label(line)
        if start is not None:
            last = (line, start)
    return None if last is None else _score_of(*last)
