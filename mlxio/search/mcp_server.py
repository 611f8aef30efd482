"""The code index as an MCP server (the official `mcp` SDK), for coding agents and editors.

Tools:
  search(query, k, mode, path, language)  ranked functions: file, line range, score, snippet
  index_status()                          the live generation, its size, model, source, updates
  reindex(full)                           bring the index up to date with its source folder now

Served over stdio (an agent starts the process) or streamable HTTP (`/mcp` on a port); the
encoder is loaded once, before the first request (`live.open_live`). A bad argument or an index
problem comes back as a tool error with one line saying what to fix; the server keeps serving.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import attrs
from typing_extensions import TypedDict  # pydantic reads its fields on Python < 3.12

from mlxio.errors import MlxioError
from mlxio.search.live import LiveIndex

log = logging.getLogger(__name__)

NAME = "mlx-code-search"
TRANSPORTS = ("stdio", "http")
INSTRUCTIONS = ("Semantic code search over an indexed repository: `search` finds functions by what they do "
                "(natural-language or code queries), with their file, line range and code; `index_status` "
                "says what is indexed; `reindex` picks up changed files now (a server started with --watch "
                "does it on every save).")


class Result(TypedDict):
    """One function found (`live.Hit`): file relative to the indexed folder, 1-based lines."""

    rank: int
    id: str
    name: str
    file: str
    line: int
    end_line: int
    language: str | None
    score: float
    snippet: str


class Results(TypedDict):
    query: str
    mode: str
    results: list[Result]


def make_server(live: LiveIndex):
    """An MCPServer whose tools search and maintain `live`."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer(NAME, instructions=INSTRUCTIONS)

    @server.tool()
    def search(query: str, k: int = 10, mode: Literal["hybrid", "semantic", "bm25"] = "hybrid",
               path: str | None = None, language: str | None = None) -> Results:
        """Find the functions of the indexed code base that best match `query` (what the code does,
        in words, or code terms). Returns up to `k` results, best first, each with its file (relative
        to the indexed folder), line and end_line, name, language, score and the first lines of its
        code. mode: hybrid (semantic + keyword, default), semantic, or bm25 (keywords only). path: a
        shell pattern on the file path, `*` crossing folders ("src/*", "*_test.go"). language: python,
        javascript, typescript, go, rust or java."""
        try:
            hits = live.search(query, k, mode, path, language)
        except (MlxioError, ValueError) as err:
            raise ToolError(str(err)) from None
        return Results(query=query, mode=mode, results=[Result(**attrs.asdict(h)) for h in hits])

    @server.tool(structured_output=True)
    def index_status() -> dict[str, Any]:
        """What is indexed: documents (functions) by language, files, tokens, segments, the model,
        the source folder, whether it is watched for changes, and the last update."""
        try:
            return live.status()
        except MlxioError as err:
            raise ToolError(str(err)) from None

    @server.tool(structured_output=True)
    def reindex(full: bool = False) -> dict[str, Any]:
        """Bring the index up to date with its source folder now: changed files are embedded again,
        deleted ones dropped (only what changed is embedded). full: also merge every segment."""
        try:
            report = live.update(compact=full)
        except MlxioError as err:
            raise ToolError(str(err)) from None
        return {"documents": report.documents, "embedded": report.embedded,
                "files_changed": report.units_changed, "files_removed": report.units_removed,
                "segments": report.segments, "seconds": round(report.seconds, 3)}

    return server


def serve(live: LiveIndex, transport: str = "stdio", host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve `live` until the client closes stdin (stdio) or the process is stopped (http)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    server = make_server(live)
    if transport == "stdio":
        server.run("stdio")
    else:
        log.info("serving MCP over streamable HTTP at http://%s:%d/mcp", host, port)
        server.run("streamable-http", host=host, port=port)
