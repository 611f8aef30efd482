"""(query, code) pairs for code search: mined from Python sources, or read from JSONL.

Mining walks source trees with `ast` (default: the running interpreter's standard library):
every function or method with a docstring gives a pair (first sentence of the docstring,
source without the docstring); undocumented non-trivial functions are kept as distractor
code for evaluation. With `suffixes` naming them, JavaScript, TypeScript, Go, Rust and Java
files are mined the same way, their functions and doc comments found by tree-sitter
(`mlxio.data.polyglot`). `split_by_file` holds out whole files, and `eval_set` builds the held-out
retrieval task (queries against candidate functions, each query with one positive).
User pairs from JSONL: `mlxio.data.pairs_jsonl`.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import logging
import os
import re
import sys
import sysconfig
import textwrap
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

from mlxio import pyparse
from mlxio.atomic import write_text_atomic
from mlxio.data import polyglot
from mlxio.errors import DataError
from mlxio.inputs import MAX_SOURCE_BYTES, read_regular, regular_kind

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class Pair:
    """One training/eval example: a natural-language query and the code it describes.

    `source` is the file the code came from (a .py path, or the JSONL path), `line` its
    1-based line there, `name` the function's qualified name ("" when unknown).
    """

    query: str
    code: str
    source: str
    line: int
    name: str = ""
    negatives: tuple[str, ...] = ()
    end_line: int = 0  # last line of the function's source (0: unknown, as in user JSONL)


@attrs.frozen(kw_only=True)
class Snippet:
    """Undocumented code (a distractor candidate for retrieval evaluation)."""

    code: str
    source: str
    line: int
    name: str
    end_line: int = 0


@attrs.frozen(kw_only=True)
class MineReport:
    """Counts of what mining saw: files parsed, files skipped (undecodable / syntax error)."""

    files: int
    undecodable: int  # not UTF-8 (nor the file's coding cookie), unreadable, or over MAX_SOURCE_BYTES
    syntax_errors: int
    trivial: int
    duplicates: int
    not_regular: int = 0  # `*.py` names that are FIFOs, devices, dangling links, ...: never opened


@attrs.frozen(kw_only=True)
class Corpus:
    """Mining result.

    pairs: documented functions of library files. distractors: undocumented (or too briefly
    documented) functions of library files with >= min_body_lines body lines. extras: the
    remaining non-trivial code (shorter bodies; every function of test / app folders, see
    NO_PAIR_DIRS), used only to top up evaluation candidates.
    """

    pairs: tuple[Pair, ...]
    distractors: tuple[Snippet, ...]
    extras: tuple[Snippet, ...]
    report: MineReport


# Never walked: installed third-party code (differs per machine), caches, bundled wheels.
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "ensurepip",
                       "pydoc_data", "node_modules"})
# Walked for distractor code only: docstrings of tests describe tests, and IDLE / turtledemo /
# lib2to3 are applications and fixers rather than the library's API.
NO_PAIR_DIRS = frozenset({"test", "tests", "idle_test", "idlelib", "lib2to3", "turtledemo"})


def stdlib_root() -> Path:
    """The running interpreter's standard-library source folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(roots: Sequence[Path], skipped: Counter | None = None,
                 suffixes: Sequence[str] = (".py",)) -> list[tuple[Path, bool]]:
    """(path, pairs allowed) for every regular file with one of `suffixes` under `roots`, in
    sorted (deterministic) order; pairs are not allowed under NO_PAIR_DIRS or in test files
    (`test_*.py`, `*_test.go`, `*.spec.ts`, ...: `polyglot.is_test_file`).
    A source name that is no regular file (a FIFO would block the reader, a link to /dev/zero
    never end) is left out and counted in `skipped` by what it is; a root that is neither a
    folder nor a regular file is a DataError naming it."""
    out: list[tuple[Path, bool]] = []
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            kind = regular_kind(root)
            if kind is not None:
                raise DataError(f"source is {kind}, not a folder or a regular file", where=str(root),
                                fix="pass a folder of .py files or a regular file")
            out.append((root, True))
            continue
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
            parts = set(Path(folder).relative_to(root).parts)
            lib = not parts & NO_PAIR_DIRS
            for f in sorted(files):
                if not f.endswith(tuple(suffixes)):
                    continue
                kind = regular_kind(Path(folder) / f)
                if kind is not None:
                    if skipped is not None:
                        skipped[kind] += 1
                    log.warning("%s: %s, not a regular file; skipped", Path(folder) / f, kind)
                    continue
                out.append((Path(folder) / f, lib and not polyglot.is_test_file(f)))
    return out


_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def first_sentence(docstring: str) -> str:
    """First sentence of a docstring's first paragraph, whitespace collapsed."""
    paragraph = docstring.strip().split("\n\n", 1)[0]
    text = " ".join(paragraph.split())
    # "e.g. x" / "i.e. y" are not sentence ends; a period followed by space otherwise is.
    for match in _SENTENCE_END.finditer(text):
        head = text[:match.start()]
        if not re.search(r"\b(e\.g|i\.e|etc|vs|cf)\.$", head, re.IGNORECASE):
            return head
    return text


def _is_trivial_stmt(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return True  # `...` or a stray string
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return False


def is_trivial(body: list[ast.stmt], min_body_lines: int) -> bool:
    """True for bodies with nothing to retrieve: pass / ... / raise NotImplementedError only,
    a single `return <constant>`, or fewer than `min_body_lines` source lines."""
    if not body or all(_is_trivial_stmt(s) for s in body):
        return True
    if len(body) == 1 and isinstance(body[0], ast.Return) and (
            body[0].value is None or isinstance(body[0].value, ast.Constant)):
        return True
    return body[-1].end_lineno - body[0].lineno + 1 < min_body_lines


def _cut(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> list[str]:
    """`lines` with the span [start, end) removed; (line index, UTF-8 byte column) positions,
    as `ast` gives them. A span alone on its lines removes those lines."""
    (l0, c0), (l1, c1) = start, end
    head = lines[l0].encode()[:c0].decode()
    tail = lines[l1].encode()[c1:].decode()
    if not head.strip() and not tail.strip():
        return lines[:l0] + lines[l1 + 1:]
    return lines[:l0] + [head + tail.lstrip("; \t")] + lines[l1 + 1:]


def function_code(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> str:
    """Source of a function (decorators and signature kept) minus its docstring, dedented."""
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    body = node.body
    seg = lines[first - 1:node.end_lineno]
    seg[-1] = seg[-1].encode()[:node.end_col_offset].decode()
    if ast.get_docstring(node, clean=False) is not None:
        doc = body[0]
        seg = _cut(seg, (doc.lineno - first, doc.col_offset),
                   (doc.end_lineno - first, doc.end_col_offset))
    return textwrap.dedent("\n".join(seg)).strip("\n")


def _functions(stmts: list[ast.stmt], prefix: str = ""):
    """(qualified name, node) for every function and method in `stmts`, nested ones
    included, in source order. Definitions are statements, so only statement lists are
    walked (a full `ast.walk` over every expression node was most of the mining time)."""
    for node in stmts:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from _functions(node.body, f"{prefix}{node.name}.")
            continue
        for field in ("body", "handlers", "orelse", "finalbody", "cases"):  # source order
            for child in getattr(node, field, ()):
                if isinstance(child, (ast.ExceptHandler, ast.match_case)):
                    yield from _functions(child.body, prefix)
                elif isinstance(child, ast.stmt):
                    yield from _functions([child], prefix)


MINER_VERSION = 1  # bump when mining rules change, so cached corpora are not reused


def mine_corpus(roots: Sequence[Path] | None = None, min_body_lines: int = 2,
                max_files: int | None = None, extras: bool = True,
                cache_dir: Path | str | None = None, suffixes: Sequence[str] = (".py",),
                show_progress: bool = True) -> Corpus:
    """Mine (docstring first sentence -> code) pairs, distractors and extras (see Corpus).

    Pairs need a first sentence of >= 3 words and a body that is not trivial and spans
    >= `min_body_lines` lines (`is_trivial`); code is de-duplicated across everything (first
    occurrence in sorted file order wins). `max_files` caps the library files read;
    `extras=False` skips the test / app folders (faster). Files that fail to decode or parse
    are skipped and counted in the report. With `cache_dir`, the result is stored there as
    JSON keyed by the settings and every file's path, size and mtime, and reused (the whole
    stdlib takes far longer to mine than to read back: dev/LOG.md). `suffixes`: the files
    mined under a folder (a file named as a root is mined whatever its suffix; see
    `polyglot.SUFFIXES` for every language). `show_progress` False: no "mining" progress display
    (a caller that mines file by file shows its own).
    """
    odd: Counter = Counter()
    files = source_files(list(roots) if roots is not None else [stdlib_root()], odd, suffixes)
    lib_files = [f for f, lib in files if lib][:max_files]
    other = [f for f, lib in files if not lib] if extras else []
    if cache_dir is None:
        return _with_odd(_mine(lib_files, other, min_body_lines, show_progress), odd)
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in lib_files + other]
    key = [MINER_VERSION, sys.version, min_body_lines, len(lib_files), stats]
    blob = json.dumps(key if tuple(suffixes) == (".py",) else [*key, sorted(suffixes)])
    path = Path(cache_dir) / f"corpus-{hashlib.sha256(blob.encode()).hexdigest()[:24]}.json"
    try:
        data = json.loads(path.read_text())
        return _with_odd(Corpus(pairs=tuple(Pair(**{**d, "negatives": tuple(d["negatives"])})
                                            for d in data["pairs"]),
                                distractors=tuple(Snippet(**d) for d in data["distractors"]),
                                extras=tuple(Snippet(**d) for d in data["extras"]),
                                report=MineReport(**data["report"])), odd)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or unreadable: mine again and rewrite it
    corpus = _mine(lib_files, other, min_body_lines, show_progress)
    write_text_atomic(path, json.dumps(attrs.asdict(corpus)), "mined corpus cache")  # readers never see half a file
    return _with_odd(corpus, odd)


def _with_odd(corpus: Corpus, odd: Counter) -> Corpus:
    """`corpus` with the `*.py` names that were no regular file counted in its report."""
    report = attrs.evolve(corpus.report, not_regular=sum(odd.values()))
    return attrs.evolve(corpus, report=report)


def _mine(lib_files: list[Path], other: list[Path], min_body_lines: int, show_progress: bool = True) -> Corpus:
    found: dict[str, list] = {"pairs": [], "distractors": [], "extras": []}
    seen: set[str] = set()
    counts = Counter()
    from mlxio.run.reporting import progress

    todo = [(f, True) for f in lib_files] + [(f, False) for f in other]
    for path, lib in progress(todo, desc="mining", unit="file", every_s=10.0) if show_progress else todo:
        language = polyglot.language_of(path)
        try:
            raw = read_regular(path, what="source file", max_bytes=MAX_SOURCE_BYTES)
            text = importlib.util.decode_source(raw) if language in ("python", None) else raw.decode("utf-8")
        except (UnicodeDecodeError, SyntaxError, LookupError, DataError):
            counts["undecodable"] += 1  # SyntaxError here: an unknown coding cookie
            continue
        if language in ("python", None):
            functions = _python_functions(text, path, min_body_lines, counts)
        else:
            functions = [(f.name, f.line, f.end_line, f.doc, f.code, f.trivial, f.body_lines >= min_body_lines)
                         for f in polyglot.functions(text, language)]
        for name, line, end_line, doc, code, trivial, long_enough in functions or ():
            if trivial:
                counts["trivial"] += 1
                continue
            if code in seen:
                counts["duplicates"] += 1
                continue
            seen.add(code)
            query = first_sentence(doc) if doc else ""
            if lib and long_enough and len(query.split()) >= 3:
                found["pairs"].append(Pair(query=query, code=code, source=str(path),
                                           line=line, name=name, end_line=end_line))
            else:
                kind = "distractors" if lib and long_enough else "extras"
                found[kind].append(Snippet(code=code, source=str(path), line=line,
                                           name=name, end_line=end_line))
    report = MineReport(files=len(lib_files) + len(other), **{
        k: counts[k] for k in ("undecodable", "syntax_errors", "trivial", "duplicates")})
    return Corpus(**{k: tuple(v) for k, v in found.items()}, report=report)


def _python_functions(text: str, path: Path, min_body_lines: int, counts: Counter) -> list[tuple] | None:
    """(name, line, end line, docstring or None, code, trivial, long enough) of every function
    in Python source `text`, or None (counted) when it does not parse."""
    try:
        with warnings.catch_warnings():  # invalid escapes etc. in old code: not our news
            warnings.simplefilter("ignore")
            tree = pyparse.parse(text, filename=str(path))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        counts["syntax_errors"] += 1
        return None
    lines = text.split("\n")
    out = []
    for name, node in _functions(tree.body):
        doc = ast.get_docstring(node)
        body = node.body[1:] if doc is not None else node.body
        trivial = is_trivial(body, 1)
        out.append((name, node.lineno, node.end_lineno, doc, "" if trivial else function_code(node, lines),
                    trivial, not is_trivial(body, min_body_lines)))
    return out


def mine_pairs(roots: Sequence[Path] | None = None, min_body_lines: int = 2,
               max_files: int | None = None) -> list[Pair]:
    """The documented pairs of `mine_corpus` (see there)."""
    return list(mine_corpus(roots, min_body_lines, max_files).pairs)


# ------------------------------------------------------------------------ split / eval


def held_out(source: str, eval_fraction: float, seed: int) -> bool:
    """Whether file `source` is in the eval half: a seeded hash of its path, uniform in
    [0, 1), below `eval_fraction`."""
    digest = hashlib.blake2b(f"{seed}\x00{source}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < eval_fraction


# The smallest multiple of 5% of files whose held-out queries from the stdlib's default mining
# reach 1,000 (see eval_set; the counts: dev/LOG.md).
EVAL_FRACTION = 0.35


def split_by_file(pairs: Sequence[Pair], eval_fraction: float = EVAL_FRACTION,
                  seed: int = 0) -> tuple[list[Pair], list[Pair]]:
    """(train, eval) with every file wholly on one side; order within each side is kept."""
    if not 0.0 <= eval_fraction <= 1.0:
        raise DataError(f"eval_fraction: expected a value in [0, 1], got {eval_fraction}")
    train, evals = [], []
    for p in pairs:
        (evals if held_out(p.source, eval_fraction, seed) else train).append(p)
    return train, evals


@attrs.frozen(kw_only=True)
class EvalSet:
    """A retrieval task: query i's relevant candidate is `candidates[positives[i]]`.

    `candidate_meta[j]` is (source path, line, function name); `candidate_ids[j]` is
    "path:line:name". positives: int64 [n_queries].
    """

    queries: tuple[str, ...]
    candidates: tuple[str, ...]
    candidate_ids: tuple[str, ...]
    candidate_meta: tuple[tuple[str, int, str], ...]
    positives: np.ndarray


def eval_set(corpus: Corpus, eval_fraction: float = EVAL_FRACTION, seed: int = 0,
             min_queries: int = 1000, min_candidates: int = 5000,
             max_queries: int | None = None, max_candidates: int | None = None, strict: bool = True) -> EvalSet:
    """The held-out retrieval task of `corpus` under `split_by_file(eval_fraction, seed)`.

    Queries: held-out pairs whose query text is unique among them (a shared docstring would
    make two positives), at most `max_queries` (a seeded sample kept in source order).
    Candidates, in this order: every held-out pair's code, the held-out library files'
    distractors, then (only while fewer than `min_candidates`) a seeded sample of held-out
    extras. Only held-out files contribute, so no candidate is a training pair's code.
    With `max_candidates`, a larger pool keeps every chosen query's positive plus a seeded
    sample of the other candidates (in pool order). Raises DataError when fewer than `min_queries` queries or `min_candidates` candidates
    can be had (raise eval_fraction or add roots), unless not `strict` (the caller then decides).
    """
    _, evals = split_by_file(corpus.pairs, eval_fraction, seed)
    rng = np.random.default_rng(seed)
    text_counts = Counter(p.query for p in evals)
    chosen = np.array([i for i, p in enumerate(evals) if text_counts[p.query] == 1], np.int64)
    if max_queries is not None and len(chosen) > max_queries:
        chosen = np.sort(rng.choice(chosen, max_queries, replace=False))
    items = [(p.code, p.source, p.line, p.name) for p in evals]
    items += [(s.code, s.source, s.line, s.name) for s in corpus.distractors
              if held_out(s.source, eval_fraction, seed)]
    extras = [s for s in corpus.extras if held_out(s.source, eval_fraction, seed)]
    need = min(max(min_candidates - len(items), 0), len(extras))
    picked = np.sort(rng.choice(len(extras), need, replace=False))
    items += [(extras[i].code, extras[i].source, extras[i].line, extras[i].name) for i in picked]
    positives = chosen.astype(np.int64)
    if max_candidates is not None and len(items) > max(max_candidates, len(chosen)):
        others = np.setdiff1d(np.arange(len(items)), positives)
        keep = np.sort(np.concatenate([positives, rng.choice(others, max(max_candidates, len(chosen)) - len(positives),
                                                             replace=False)]))
        items = [items[i] for i in keep]
        positives = np.searchsorted(keep, positives).astype(np.int64)
    if strict and (len(chosen) < min_queries or len(items) < min_candidates):
        raise DataError(f"eval set: {len(chosen)} queries / {len(items)} candidates from "
                        f"held-out files, need >= {min_queries} / {min_candidates} "
                        f"(raise eval_fraction or add source roots)")
    return EvalSet(queries=tuple(evals[i].query for i in chosen),
                   candidates=tuple(c for c, *_ in items),
                   candidate_ids=tuple(f"{s}:{ln}:{n}" for _, s, ln, n in items),
                   candidate_meta=tuple((s, ln, n) for _, s, ln, n in items),
                   positives=positives)
