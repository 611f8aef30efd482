"""The front door and the guides: the README stays short, every relative link resolves, the
results tables are the ones `python -m benchmarks.make_table` generates from the committed
JSONs (regenerated, never edited by hand), and no page describes the development machines or
their sittings instead of the product."""

import re
from pathlib import Path

import pytest

from benchmarks import make_table

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# a development machine's paths, a device call's output folder, a working sitting or lease
DIARY = re.compile(r"/work/|FILES_AT|\.device/|\bsession \d|\blease \d|\bleases\b")


def test_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_resolve_and_no_diary(page):
    text = page.read_text()
    broken = [t for t in LINK.findall(text) if not t.startswith(("http://", "https://"))
              and not (page.parent / t).exists()]
    assert not broken, f"{page.name}: links to missing {broken}"
    assert not DIARY.findall(text), f"{page.name}: {sorted(set(DIARY.findall(text)))}"


def generated(path: Path, block: str = "") -> str:
    text = path.read_text()
    return text.split(make_table.begin(block), 1)[1].split(make_table.END, 1)[0].strip("\n")


def test_results_tables_are_generated_from_the_jsons():
    assert generated(ROOT / "README.md") == "\n".join(make_table.default_run_sections()).strip("\n")
    bars = []
    assert generated(ROOT / "docs" / "performance.md") == "\n".join(make_table.performance_sections(bars)).strip("\n")


@pytest.mark.parametrize("block", sorted(make_table.retriever_guide_sections()))
def test_the_retriever_guides_sweep_tables_are_generated(block):
    lines = make_table.retriever_guide_sections()[block]
    assert lines, f"docs/retriever.md's {block}: no committed result to generate it from"
    assert generated(ROOT / "docs" / "retriever.md", block) == "\n".join(lines).strip("\n")


@pytest.mark.parametrize("block", sorted(make_table.code_search_guide_sections()))
def test_the_code_search_guides_pooling_tables_are_generated(block):
    lines = make_table.code_search_guide_sections()[block]
    assert lines, f"docs/code-search.md's {block}: no committed result to generate it from"
    assert generated(ROOT / "docs" / "code-search.md", block) == "\n".join(lines).strip("\n")
