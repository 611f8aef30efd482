"""JSON-RPC 2.0 over newline-delimited JSON on a byte stream (the stdio framing of LSP / MCP
servers without the headers): one request object per line in, one response object per line
out, answered strictly in arrival order by one thread.

`Server(methods).serve(infile, outfile)` reads lines until EOF or a handler asks to stop.
Every line gets exactly one response line (a notification, a request without "id", gets
none; a batch, a JSON array, gets one array): malformed JSON -> -32700, not a request object
-> -32600, unknown method -> -32601, params failing the method's schema -> -32602 (the message
names the field), a line longer than `max_line_bytes` -> REQUEST_TOO_LARGE (its bytes are
skipped up to the next newline, never buffered), a handler's failure -> its `RpcError` or
WORKER_ERROR with the exception type in `data`. The server goes on after each of them.

Schemas are a small subset of JSON Schema (type, properties, required,
additionalProperties: false, items, minItems, maxItems, minimum, maximum, enum, default,
description) checked by `check`; the same dicts document the protocol (docs/worker-protocol.md).
"""

from __future__ import annotations

import json
import logging
import math
import time
import traceback
from collections.abc import Callable
from typing import Any, BinaryIO

log = logging.getLogger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# the project's own, in JSON-RPC's server-defined range -32000..-32099
WORKER_ERROR = -32000  # a method failed at run time; data.type names the exception class
NOT_INITIALIZED = -32001  # a method that needs `initialize` came first
CONFIG_ERROR = -32002  # the config (or a value derived from it) is wrong; message names the key
CHECKPOINT_ERROR = -32003  # no / corrupt / foreign checkpoint
REQUEST_TOO_LARGE = -32004  # a line longer than the server's max_line_bytes
TRAINING_DIVERGED = -32005  # too many consecutive non-finite steps
OUT_DIR_BUSY = -32006  # another process (a recipe run, another worker) writes the run directory (its .lock)

DEFAULT_MAX_LINE_BYTES = 64 << 20


class RpcError(Exception):
    """A failure reported to the client as {"code", "message", "data"}."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data

    def to_json(self) -> dict:
        from mlxio.redact import redact_text

        err = {"code": self.code, "message": redact_text(self.message)}  # no user:pass@ sent back
        if self.data is not None:
            err["data"] = self.data
        return err


class Stop(Exception):
    """Raised by a handler (after its result is ready) to end `serve` once it is answered."""

    def __init__(self, result: Any) -> None:
        super().__init__("stop")
        self.result = result


# ------------------------------------------------------------------------------ schemas

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def check(value: Any, schema: dict, where: str = "params") -> None:
    """Raise RpcError(INVALID_PARAMS) naming the first place `value` breaks `schema`."""
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_TYPES[k](value) for k in kinds):
            raise RpcError(INVALID_PARAMS, f"{where}: expected {' or '.join(kinds)}, got "
                           f"{_json_type(value)}", {"field": where})
    if isinstance(value, float) and not math.isfinite(value):
        raise RpcError(INVALID_PARAMS, f"{where}: must be finite", {"field": where})
    if "enum" in schema and value not in schema["enum"]:
        raise RpcError(INVALID_PARAMS, f"{where}: must be one of {schema['enum']}, got {value!r}",
                       {"field": where})
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            raise RpcError(INVALID_PARAMS, f"{where}: must be >= {schema['minimum']}, got {value}",
                           {"field": where})
        if "maximum" in schema and value > schema["maximum"]:
            raise RpcError(INVALID_PARAMS, f"{where}: must be <= {schema['maximum']}, got {value}",
                           {"field": where})
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                raise RpcError(INVALID_PARAMS, f"{where}.{name}: required", {"field": f"{where}.{name}"})
        for name, item in value.items():
            if name in props:
                check(item, props[name], f"{where}.{name}")
            elif schema.get("additionalProperties", True) is False:
                raise RpcError(INVALID_PARAMS, f"{where}.{name}: unknown field (known: "
                               f"{', '.join(sorted(props))})", {"field": f"{where}.{name}"})
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            raise RpcError(INVALID_PARAMS, f"{where}: needs at least {schema['minItems']} items",
                           {"field": where})
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise RpcError(INVALID_PARAMS, f"{where}: at most {schema['maxItems']} items",
                           {"field": where})
        if "items" in schema:
            item_schema = schema["items"]
            if _is_flat_number_schema(item_schema):  # fast path: token ids, log-probs
                _check_numbers(value, item_schema, where)
            else:
                for i, item in enumerate(value):
                    check(item, item_schema, f"{where}[{i}]")


def _is_flat_number_schema(schema: dict) -> bool:
    return schema.get("type") in ("integer", "number") and set(schema) <= {
        "type", "minimum", "maximum", "description"}


def _check_numbers(values: list, schema: dict, where: str) -> None:
    ok = _TYPES[schema["type"]]
    lo, hi = schema.get("minimum", -math.inf), schema.get("maximum", math.inf)
    for i, v in enumerate(values):
        if not ok(v) or not lo <= v <= hi or (isinstance(v, float) and not math.isfinite(v)):
            check(v, schema, f"{where}[{i}]")  # raises with the message


def _json_type(value: Any) -> str:
    for name, test in _TYPES.items():
        if name != "number" and test(value):
            return name
    return "number" if _TYPES["number"](value) else type(value).__name__


# ------------------------------------------------------------------------------- server

class Method:
    """A handler with its params / result schemas (`result` only documents and tests)."""

    def __init__(self, fn: Callable[[dict], Any], params: dict, result: dict, doc: str = "") -> None:
        self.fn, self.params, self.result, self.doc = fn, params, result, doc


def _response(id_: Any, result: Any = None, error: RpcError | None = None) -> dict:
    if error is not None:
        return {"jsonrpc": "2.0", "id": id_, "error": error.to_json()}
    return {"jsonrpc": "2.0", "id": id_, "result": result}


def encode(message: Any) -> bytes:
    """One protocol line: compact JSON (no NaN / Infinity: they are not JSON) + newline."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"


class Server:
    def __init__(self, methods: dict[str, Method], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                 error_codes: dict[type, int] | None = None) -> None:
        self.methods = methods
        self.max_line_bytes = max_line_bytes
        self.error_codes = error_codes or {}  # exception class -> code, checked in order
        self.stopping = False

    # one message ------------------------------------------------------------------------
    def call(self, request: Any) -> dict | None:
        """The response object for one decoded request (None for a notification)."""
        if not isinstance(request, dict) or request.get("jsonrpc") != "2.0" \
                or not isinstance(request.get("method"), str):
            id_ = request.get("id") if isinstance(request, dict) else None
            return _response(id_ if _valid_id(id_) else None, error=RpcError(
                INVALID_REQUEST, "not a JSON-RPC 2.0 request: needs \"jsonrpc\": \"2.0\" and a "
                "string \"method\""))
        notification = "id" not in request
        id_ = request.get("id")
        if not notification and not _valid_id(id_):
            return _response(None, error=RpcError(INVALID_REQUEST, "id must be a string, an "
                                                  "integer or null"))
        try:
            result = self._dispatch(request["method"], request.get("params", {}))
            response = _response(id_, result)
        except Stop as stop:
            self.stopping = True
            response = _response(id_, stop.result)
        except RpcError as err:
            response = _response(id_, error=err)
        return None if notification else response

    def _dispatch(self, name: str, params: Any) -> Any:
        method = self.methods.get(name)
        if method is None:
            raise RpcError(METHOD_NOT_FOUND, f"unknown method {name!r} (known: "
                           f"{', '.join(sorted(self.methods))})")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise RpcError(INVALID_PARAMS, "params: expected an object (by-name params)")
        check(params, method.params)
        t0 = time.perf_counter()
        try:
            result = method.fn(params)
        except (RpcError, Stop):
            raise
        except Exception as err:  # noqa: BLE001  (reported to the client; the server goes on)
            code = next((c for cls, c in self.error_codes.items() if isinstance(err, cls)),
                        WORKER_ERROR)
            log.error("%s failed: %s: %s", name, type(err).__name__, err)
            log.debug("%s", traceback.format_exc())
            raise RpcError(code, f"{name}: {err}", {"type": type(err).__name__}) from None
        log.info("%s: %.1f ms", name, 1000 * (time.perf_counter() - t0))
        return result

    def handle_line(self, line: bytes) -> bytes | None:
        """Response bytes for one input line (without its newline), or None."""
        if not line.strip():
            return None
        try:
            request = json.loads(line)
        except (ValueError, RecursionError) as err:  # (UnicodeDecodeError is a ValueError)
            return encode(_response(None, error=RpcError(PARSE_ERROR, f"parse error: {err}")))
        if isinstance(request, list):
            if not request:
                return encode(_response(None, error=RpcError(INVALID_REQUEST, "empty batch")))
            responses = [r for r in map(self.call, request) if r is not None]
            if not responses:
                return None
            try:
                return encode(responses)
            except (TypeError, ValueError):
                return encode([_encodable(r) for r in responses])
        response = self.call(request)
        if response is None:
            return None
        try:
            return encode(response)
        except (TypeError, ValueError):
            return encode(_encodable(response))

    # the stream ---------------------------------------------------------------------------
    def serve(self, infile: BinaryIO, outfile: BinaryIO) -> str:
        """Answer lines until EOF ("eof"), a Stop ("shutdown") or a closed outfile ("client gone")."""
        while not self.stopping:
            line = infile.readline(self.max_line_bytes + 1)
            if not line:
                return "eof"
            if len(line) > self.max_line_bytes and not line.endswith(b"\n"):
                skipped = len(line) + _skip_line(infile)
                log.warning("request line of %d bytes refused (max %d)", skipped, self.max_line_bytes)
                out = encode(_response(None, error=RpcError(
                    REQUEST_TOO_LARGE, f"request line of {skipped} bytes exceeds the limit of "
                    f"{self.max_line_bytes} bytes", {"max_line_bytes": self.max_line_bytes})))
            else:
                out = self.handle_line(line.rstrip(b"\r\n"))
            if out is not None:
                try:
                    outfile.write(out)
                    outfile.flush()
                except BrokenPipeError:
                    return "client gone"
        return "shutdown"


def _encodable(response: dict) -> dict:
    """`response`, or an error response in its place when its result is not strict JSON
    (NaN / Infinity, or a type json cannot write): the client always gets a parseable line."""
    try:
        encode(response)
        return response
    except (TypeError, ValueError) as err:
        return _response(response.get("id"), error=RpcError(
            WORKER_ERROR, f"result is not JSON-able: {err}", {"type": type(err).__name__}))


def _valid_id(id_: Any) -> bool:
    return id_ is None or isinstance(id_, str) or (isinstance(id_, int) and not isinstance(id_, bool))


def _skip_line(infile: BinaryIO, chunk: int = 1 << 20) -> int:
    """Read and drop the rest of the current line; returns the bytes dropped."""
    dropped = 0
    while True:
        part = infile.readline(chunk)
        dropped += len(part)
        if not part or part.endswith(b"\n"):
            return dropped
