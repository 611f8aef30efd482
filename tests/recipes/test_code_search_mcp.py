"""`code_search serve`: the MCP server as a coding agent reaches it, spawned as a process and
driven by the MCP SDK's own client, over stdio and streamable HTTP, with the embedded MiniLM."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

mcp = pytest.importorskip("mcp")

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {
    "dates.py": '''def parse_date(text):
    """Split a day/month/year string into integers."""
    day, month, year = text.split("/")
    return int(year), int(month), int(day)


def add_numbers(a, b):
    """Return the sum of two numbers."""
    total = a + b
    return total
''',
    "files.py": '''def read_lines(path):
    """Read a text file and return its lines."""
    with open(path) as handle:
        return handle.read().splitlines()
''',
    "web/fetch.js": '''/**
 * Download a web page over HTTP and return its body.
 */
export async function fetchPage(url) {
  const response = await fetch(url);
  return await response.text();
}
''',
    "cache/lru.go": '''package cache

// Evict removes the least recently used entry from the cache.
func (c *Cache) Evict() string {
	key := c.order.Front()
	delete(c.items, key)
	return key
}
''',
}
QUERIES = {  # each function's doc comment -> its name
    "Split a day/month/year string into integers.": "parse_date",
    "Read a text file and return its lines.": "read_lines",
    "Download a web page over HTTP and return its body.": "fetchPage",
    "removes the least recently used entry from the cache.": "Cache.Evict",
}


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    from mlxio.weights.encoders import default_encoder_path
    from recipes import code_search

    try:
        model = str(default_encoder_path())
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"embedded MiniLM not installed: {err}")
    root = tmp_path_factory.mktemp("mcp")
    src, idx = root / "src", root / "idx"
    for name, text in SOURCES.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    assert code_search.cli(["index", str(src), "--model", model, "--index", str(idx), "--max-doc-len", "64",
                            "--no-progress"]) == 0
    return src, idx


def _command(idx: Path, *extra: str) -> list[str]:
    return ["-m", "recipes.code_search", "serve", "--index", str(idx), *extra]


def _env() -> dict[str, str]:
    keep = ("PYTHONPATH", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "MLXIO_MALLOC", "TMPDIR")
    return {k: os.environ[k] for k in keep if k in os.environ} | {"PYTHONPATH": str(ROOT)}


async def _check_tools(client, src: Path) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"search", "index_status", "reindex"}
    assert {"query", "k", "mode", "path", "language"} <= set(tools["search"].input_schema["properties"])
    for query, name in QUERIES.items():
        result = await client.call_tool("search", {"query": query, "k": 3, "mode": "semantic"})
        hits = result.structured_content["results"]
        assert not result.is_error and hits[0]["name"] == name, (query, [h["name"] for h in hits])
    top = (await client.call_tool("search", {"query": "least recently used cache entry", "k": 1,
                                             "language": "go"})).structured_content["results"][0]
    assert (top["file"], top["line"], top["end_line"], top["language"]) == ("cache/lru.go", 4, 8, "go")
    assert top["snippet"].startswith("func (c *Cache) Evict() string {") and top["score"] > 0
    only_py = (await client.call_tool("search", {"query": "numbers", "k": 5, "path": "*.py"})).structured_content
    assert only_py["results"] and all(h["file"].endswith(".py") for h in only_py["results"])
    status = (await client.call_tool("index_status", {})).structured_content
    assert status["documents"] == 5 and status["documents_by_language"] == {"go": 1, "javascript": 1, "python": 3}
    bad = await client.call_tool("search", {"query": "x", "language": "cobol"})
    assert bad.is_error and "language must be one of" in bad.content[0].text


def test_stdio_server_searches_and_reindexes(indexed):
    import anyio
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    src, idx = indexed
    params = StdioServerParameters(command=sys.executable, args=_command(idx), env=_env(), cwd=str(ROOT))

    async def session() -> None:
        async with Client(params) as client:
            await _check_tools(client, src)
            (src / "extra.py").write_text('def rotate_prize_wheel(turns):\n    """Rotate the prize wheel."""\n'
                                          '    degrees = turns * 360\n    return degrees\n')
            try:
                done = (await client.call_tool("reindex", {})).structured_content
                assert done["embedded"] == 1 and done["files_changed"] == 1 and done["documents"] == 6
                hits = (await client.call_tool("search", {"query": "Rotate the prize wheel.",
                                                          "k": 1})).structured_content["results"]
                assert hits[0]["name"] == "rotate_prize_wheel" and hits[0]["file"] == "extra.py"
            finally:
                (src / "extra.py").unlink()
                await client.call_tool("reindex", {})

    anyio.run(session)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # a second server process (model load) beside the stdio test
def test_http_server_answers_the_sdk_client(indexed, tmp_path):
    import anyio
    from mcp.client import Client

    src, idx = indexed
    port = _free_port()
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed below
    server = subprocess.Popen([sys.executable, *_command(idx, "--transport", "http", "--port", str(port))],
                              cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300  # model load on a loaded box; a bound, not a speed check
        while time.monotonic() < deadline and server.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]

        async def session() -> None:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                await _check_tools(client, src)

        anyio.run(session)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_serve_without_an_index_or_folder_is_one_line(tmp_path, capsys):
    from recipes import code_search

    assert code_search.cli(["serve", "--index", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "give --model MODEL and --watch SRC" in err
    assert code_search.cli(["serve", "--index", str(tmp_path / "none"), "--watch", str(tmp_path / "nofolder")]) == 1
    assert "not a folder" in capsys.readouterr().err
