"""The live index (mlxio.search.live): searches during updates see one whole generation,
filters, the watcher. Deterministic fake embeddings (no model)."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

from mlxio.search import build
from mlxio.search.index import SearchArgumentError
from mlxio.search.live import LiveIndex
from tests.mlxio.search.test_search_index import META, FakeEmbed, _write_sources

FUNCTIONS = 6  # in the edited file, every version


def _version_file(path, version: int) -> None:
    """A file whose every function carries `version` in its name and body."""
    path.write_text("\n\n".join(
        f"def crunch_v{version}_{i}(value):\n    total = crunch(value, {i})\n    return total + {version}\n"
        for i in range(FUNCTIONS)))


def _live(src, idx, embed=None):
    embed = embed or FakeEmbed()
    build.update(src, idx, embed, META)
    return LiveIndex(idx, lambda texts: embed(texts),
                     lambda s, i, compact: build.update(s, i, embed, META, compact=compact), src)


def test_a_search_during_updates_sees_one_whole_generation(tmp_path):
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, n_files=3)
    _version_file(src / "hot.py", 0)
    live = _live(src, idx)
    total = live.index.n_docs
    seen_versions, errors, done = set(), [], threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                index = live.index
                versions = {re.search(r"_v(\d+)_", index.record(int(d))["name"]).group(1)
                            for d in index.live_ids if index.record(int(d))["name"].startswith("crunch_v")}
                assert len(versions) == 1 and index.n_docs == total, (versions, index.n_docs)
                for mode in ("semantic", "bm25", "hybrid"):
                    hits = live.search("crunch value total", k=FUNCTIONS, mode=mode, path="hot.py")
                    got = {re.search(r"_v(\d+)_", h.name).group(1) for h in hits}
                    assert len(hits) == FUNCTIONS and len(got) == 1, (mode, [h.name for h in hits])
                    seen_versions.update(got)
            except Exception as err:  # noqa: BLE001 - collected for the main thread
                errors.append(err)
                return

    readers = [threading.Thread(target=read) for _ in range(2)]
    for r in readers:
        r.start()
    for version in range(1, 9):
        _version_file(src / "hot.py", version)
        report = live.update()
        assert report.embedded == FUNCTIONS and live.index.n_docs == total
    done.set()
    for r in readers:
        r.join()
    assert not errors, errors[0]
    assert live.updates == 8 and live.status()["last_update"]["units_changed"] == 1
    assert {h.name for h in live.search("crunch value", k=FUNCTIONS, path="hot.py")} == \
        {f"crunch_v8_{i}" for i in range(FUNCTIONS)}


def test_filters_line_ranges_and_bad_arguments(tmp_path):
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, n_files=4)
    (src / "pkg").mkdir()
    (src / "pkg" / "tree.go").write_text("package pkg\n\n// Insert puts a key into the tree.\n"
                                         "func Insert(t *Tree, key int) *Tree {\n\tt = grow(t)\n"
                                         "\treturn t.insert(key)\n}\n")
    live = _live(src, idx)
    hits = live.search("insert key tree", k=3, mode="bm25", language="go")
    assert [(h.name, h.file, h.line, h.end_line, h.language) for h in hits] == \
        [("Insert", "pkg/tree.go", 4, 7, "go")]
    assert hits[0].snippet.startswith("func Insert(t *Tree, key int) *Tree {")
    assert all(h.file.startswith("mod1") for h in live.search("parse value", k=5, path="mod1*"))
    assert all(h.language == "python" for h in live.search("parse value", k=5, language="python"))
    status = live.status()
    assert status["documents_by_language"] == {"go": 1, "python": 20} and status["files"] == 5
    for bad in ({"query": " "}, {"query": "x", "k": 0}, {"query": "x", "language": "cobol"},
                {"query": "x", "mode": "fuzzy"}):
        with pytest.raises(SearchArgumentError):
            live.search(**bad)


def test_the_watcher_indexes_a_saved_file(tmp_path):
    pytest.importorskip("watchfiles")
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, n_files=2)
    live = _live(src, idx)
    live.start_watching()
    try:
        assert live.status()["watching"]
        (src / "fresh.py").write_text("def quantum_flux_capacitor(energy):\n    level = energy * 2\n    return level\n")
        deadline = time.monotonic() + 120  # a bound for a loaded box, not a speed check
        while time.monotonic() < deadline and not live.search("quantum flux capacitor", k=1, mode="bm25"):
            time.sleep(0.05)
        hits = live.search("quantum flux capacitor", k=1, mode="bm25")
        assert hits and hits[0].name == "quantum_flux_capacitor" and live.updates >= 1
    finally:
        live.stop()
    assert not live.status()["watching"]


def test_an_update_that_fails_keeps_the_old_generation(tmp_path):
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, n_files=2)
    live = _live(src, idx, FakeEmbed())
    before = live.index
    (src / "new.py").write_text("def fresh_thing(x):\n    y = x + 1\n    return y\n")
    live._update_index = lambda s, i, compact: build.update(s, i, FakeEmbed(fail_after=0), META)
    with pytest.raises(KeyboardInterrupt):
        live.update()
    assert live.index is before and "KeyboardInterrupt" in live.status()["last_error"]
    assert np.array_equal(live.index.live_ids, before.live_ids)


def test_the_same_folder_by_another_path_reuses_the_index(tmp_path):
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, n_files=2)
    embed = FakeEmbed()
    build.update(src, idx, embed, META)
    (tmp_path / "link").symlink_to(src)
    live = LiveIndex(idx, embed, lambda s, i, compact: build.update(s, i, embed, META, compact=compact),
                     tmp_path / "link")
    assert live.source == src and live.update().embedded == 0  # not every file again under new names


def test_open_live_loads_the_model_once_for_searches_and_updates(tmp_path, monkeypatch):
    from mlxio.search import live as live_mod
    from mlxio.search import searcher
    from mlxio.weights import encoders

    try:
        model = str(encoders.default_encoder_path())
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"embedded MiniLM not installed: {err}")
    loads = []
    real = encoders.load_encoder
    for module in (encoders, searcher):  # every name it is loaded by
        monkeypatch.setattr(module, "load_encoder", lambda *a, **k: loads.append(a) or real(*a, **k))
    src, idx = tmp_path / "src", tmp_path / "idx"
    src.mkdir()
    (src / "a.py").write_text("def parse_date(text):\n    day, month = text.split('/')\n    return day, month\n")
    live = live_mod.open_live(idx, src, model)  # builds the missing index with the model it loaded
    (src / "b.py").write_text("def read_lines(path):\n    text = open(path).read()\n    return text.splitlines()\n")
    assert live.update().embedded == 1
    assert live.search("read the lines of a file", k=1)[0].name == "read_lines"
    assert live.update().embedded == 0 and len(loads) == 1
