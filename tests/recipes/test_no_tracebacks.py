"""Inputs that crashed or were taken silently are one line: a huge MLXIO_CACHE_LIMIT_MB, a keyword as
a problem's entry_point, an index manifest listing no segments, a query id that is no string or
integer (NaN was written back as invalid JSON); and `--data.max_chars` applies to folder sources."""

from __future__ import annotations

import json
import keyword
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxio.errors import DataError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value", ["9" * 30, "\u00b2", "-1", "1e9", "12.5"])
def test_a_bad_cache_limit_is_one_line(value):
    proc = subprocess.run([sys.executable, "-c", "from mlxio.runtime import setup; setup()"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "MLXIO_CACHE_LIMIT_MB": value})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "MLXIO_CACHE_LIMIT_MB" in lines[0], proc.stderr


def _problem_line(entry_point) -> str:
    return json.dumps({"task_id": "t/0", "prompt": "def f():\n", "entry_point": entry_point,
                       "test": "def check(candidate):\n    assert candidate() == 1\n"})


@given(name=st.sampled_from(keyword.kwlist))
def test_a_keyword_entry_point_is_refused(tmp_path_factory, name):
    from mlxio.rl.problems import load_problems_jsonl

    path = tmp_path_factory.mktemp("p") / "problems.jsonl"
    path.write_text(_problem_line(name) + "\n")
    with pytest.raises(DataError, match="entry_point") as caught:
        load_problems_jsonl(path)
    assert f"{path}:1" in caught.value.contract_line()


def test_an_ordinary_entry_point_is_kept(tmp_path):
    from mlxio.rl.problems import load_problems_jsonl

    path = tmp_path / "problems.jsonl"
    path.write_text(_problem_line("match") + "\n")  # a soft keyword is a valid function name
    assert load_problems_jsonl(path)[0].entry_point == "match"


JSON_IDS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
                     st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@given(bad=JSON_IDS)
def test_a_query_id_that_is_no_string_or_integer_is_refused(tmp_path_factory, bad):
    from mlxio.search.query_files import read_queries

    path = tmp_path_factory.mktemp("q") / "q.jsonl"
    text = json.dumps({"id": bad, "query": "add numbers"}) if not (isinstance(bad, float) and not math.isfinite(bad)) \
        else '{"id": %s, "query": "add numbers"}' % ("NaN" if math.isnan(bad) else ("Infinity" if bad > 0 else "-Infinity"))
    path.write_text(text + "\n")
    with pytest.raises(DataError, match="query id") as caught:
        read_queries(path)
    assert "\n" not in caught.value.contract_line()


def test_string_and_integer_ids_are_kept(tmp_path):
    from mlxio.search.query_files import read_queries

    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a", "query": "x"}\n{"id": 7, "query": "y"}\n')
    assert [r["id"] for r in read_queries(path)] == ["a", 7]


def test_an_index_manifest_listing_no_segments_is_refused(tmp_path):
    from mlxio.search import build, store
    from mlxio.search.index import Index
    from tests.mlxio.search.test_search_index import META, FakeEmbed, _write_sources

    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, n_files=2)
    build.update(src, idx, FakeEmbed(), META)
    manifest_path = store.current(idx) / "manifest.json"
    for segments in ([], None):
        manifest = json.loads(manifest_path.read_text())
        if segments is None:
            manifest.pop("segments")
        else:
            manifest["segments"] = segments
        os.chmod(manifest_path, 0o644)
        manifest_path.write_text(json.dumps(manifest))
        with pytest.raises(store.IndexError_, match="segments") as caught:
            Index(idx)
        assert "\n" not in str(caught.value) and "rebuild" in str(caught.value)


def test_max_chars_applies_to_a_folder_source(tmp_path):
    from mlxio.data.xtr_data import DataConfig, load_data

    src = tmp_path / "lib"
    src.mkdir()
    body = "".join(f"    value_{i} = x * {i} + {i}\n" for i in range(30))
    for f in range(12):
        (src / f"mod{f}.py").write_text("".join(
            f'def fn_{f}_{j}(x):\n    """Compute the {j}th polynomial value of x in module {f}."""\n{body}    return x\n\n'
            for j in range(6)))
    data = DataConfig(source=str(src), packages=(), heldout_packages=(), max_chars=60, eval_queries=5,
                      min_eval_queries=1, min_eval_candidates=1, dev_queries=0, max_eval_candidates=0,
                      hard_negatives=0)
    loaded = load_data(data, tmp_path / "cache", seed=0)
    texts = [t for p in loaded.train for t in (p.query, p.code)] + list(loaded.task.candidates)
    assert texts and max(len(t) for t in texts) <= 60
    assert any(len(t) == 60 for t in texts)  # the bodies were longer: cut, not dropped
