"""benchmarks.search_multilingual: the study's summary from run folders (means over seeds, the
paired difference against the control over the same queries), its table, and the multilingual
preset's packages (none of them held out for any language)."""

import json

import numpy as np
import pytest

from benchmarks import search_multilingual as sm
from mlxio.data import package_sources


def _language_entry(lang: str, rr_semantic: list[float], rr_hybrid: list[float], bm25: float = 0.4) -> dict:
    return {"language": lang, "queries": len(rr_semantic), "candidates": 50,
            "packages": [{"name": f"{lang}pkg", "version": "1.0"}],
            "semantic": {"mrr@10": round(float(np.mean(rr_semantic)), 4), "rr": rr_semantic},
            "hybrid_rrf": {"mrr@10": round(float(np.mean(rr_hybrid)), 4), "rr": rr_hybrid},
            "bm25": {"mrr@10": bm25}}


def _write(runs, name: str, entries: list[dict]) -> None:
    path = runs / "languages" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"languages": entries}))


def test_summary_means_and_paired_difference(tmp_path):
    arms = sm.parse_arms("python20=--preset quick;multilingual=--preset multilingual")
    _write(tmp_path, "untrained", [_language_entry("go", [0.5, 0.5, 0.0], [0.5, 0.5, 0.0])])
    rr = {("python20", 0): [1.0, 0.5, 0.0], ("python20", 1): [1.0, 0.0, 0.0],
          ("multilingual", 0): [1.0, 1.0, 0.5], ("multilingual", 1): [1.0, 1.0, 0.0]}
    for (arm, seed), values in rr.items():
        _write(tmp_path, f"{arm}_s{seed}", [_language_entry("go", values, values)])
        run = tmp_path / f"{arm}_s{seed}"
        run.mkdir()
        run.joinpath("eval.json").write_text(json.dumps(
            {"heldout_packages": {"fine-tuned": {"semantic": {"mrr@10": 0.6 + seed / 10}}}}))
    out = sm.summary(tmp_path, arms, [0, 1], sm.parse_compare("multilingual=python20", arms))
    go = out["languages"]["go"]
    assert go["bm25"] == 0.4 and go["untrained"]["semantic"] == pytest.approx(1 / 3, abs=1e-4)
    assert go["arms"]["python20"]["semantic"]["mean"] == pytest.approx(np.mean([0.5, 1 / 3]), abs=1e-4)
    diff = go["arms"]["multilingual"]["minus_python20"]["semantic"]
    per_query = np.mean([rr[("multilingual", s)] for s in (0, 1)], 0) - np.mean([rr[("python20", s)] for s in (0, 1)], 0)
    assert diff["mrr@10"] == pytest.approx(per_query.mean(), abs=1e-4)
    assert diff["se"] == pytest.approx(np.std(per_query, ddof=1) / np.sqrt(3), abs=1e-4)
    assert out["recipe_heldout_packages"]["multilingual"]["heldout_packages_semantic_mrr@10"] == [0.6, 0.7]
    assert out["unfinished"] == []
    table = "\n".join(sm.section({"command": "c", **out}, "cpu"))
    assert "| go | 3 / 50 | 0.400 | 0.333 |" in table and f"{per_query.mean():+.3f}" in table


def test_unfinished_runs_are_named_not_averaged(tmp_path):
    arms = sm.parse_arms("python20=--preset quick;multilingual=--preset multilingual")
    _write(tmp_path, "untrained", [_language_entry("rust", [0.5], [0.5])])
    _write(tmp_path, "python20_s0", [_language_entry("rust", [1.0], [1.0])])
    out = sm.summary(tmp_path, arms, [0], sm.parse_compare("multilingual=python20", arms))
    assert out["unfinished"] == ["multilingual_s0"]
    assert "multilingual" not in out["languages"]["rust"]["arms"]
    assert "Unfinished runs (left out): multilingual_s0." in "\n".join(sm.section({"command": "c", **out}, "cpu"))


@pytest.mark.parametrize("bad", ["noequals", "1bad=--preset quick"])
def test_bad_arms_are_one_line(bad):
    with pytest.raises(SystemExit, match="--arms"):
        sm.parse_arms(bad)


@pytest.mark.parametrize("bad", ["multilingual", "multilingual=python99", "other=python20"])
def test_bad_comparisons_are_one_line(bad):
    arms = sm.parse_arms(sm.ARMS)
    with pytest.raises(SystemExit, match="--compare"):
        sm.parse_compare(bad, arms)


def test_training_packages_are_never_held_out():
    """No language's held-out package is trained on; of the JDK, whose java.util is held out,
    only other folders are."""
    held = {package_sources.entry_name(e) for group in package_sources.HELDOUT.values() for e in group}
    for language, entries in package_sources.TRAIN.items():
        for entry in entries:
            name = package_sources.entry_name(entry)
            if name == "openjdk-17-source":
                assert "/java/util" not in entry, entry
            else:
                assert name not in held, (language, entry)
