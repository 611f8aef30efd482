"""`code_search index` off a terminal: one progress line per phase (reading the changed files,
embedding), none per file, none repeated, and no rate over a phase too short to measure one.
The progress clock is injected and does not move."""

import io
import logging

from test_search_index import META, FakeEmbed, _write_sources  # tests/ helpers

from mlxio.run import reporting
from mlxio.search import build
from mlxio.search.searcher import progress_bar


def test_one_line_per_phase_first_build_and_update(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a terminal: log lines
    monkeypatch.setattr(reporting, "CLOCK", lambda: 100.0)
    caplog.set_level(logging.INFO)
    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, n_files=6, per_file=4)
    embed = FakeEmbed()

    def phases() -> list[str]:
        lines = [r.getMessage() for r in caplog.records if r.name in ("mlxio.progress", "mlxio.search.searcher")]
        caplog.clear()
        return lines

    build.update(src, idx, embed, META, progress=progress_bar("embedding"))
    assert phases() == ["reading: 6/6 file (100%), done in 0s", "embedding: 24/24 fn (100%), done in 0s"]
    (src / "mod1.py").write_text("def brand_new(value):\n    return encode(token, value)\n")
    build.update(src, idx, embed, META, progress=progress_bar("embedding"))
    assert phases() == ["reading: 1/1 file (100%), done in 0s", "embedding: 1/1 fn (100%), done in 0s"]


def test_an_update_whose_changed_file_holds_no_function(tmp_path):
    """A changed file that yields no document (here: not Python any more) is indexed as an empty
    unit: its old documents tombstoned, no error (it raised UnboundLocalError)."""
    from mlxio.search.index import Index

    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, n_files=3, per_file=2)
    build.update(src, idx, FakeEmbed(), META)
    before = Index(idx).n_docs
    (src / "mod1.py").write_text("def broken(:\n")
    report = build.update(src, idx, FakeEmbed(), META)
    assert report.units_changed == 1 and report.embedded == 0
    assert Index(idx).n_docs == before - 2
