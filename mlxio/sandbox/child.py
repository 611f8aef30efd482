"""The code that runs INSIDE the sandbox (see `mlxio.sandbox.runner` for the threat model).

This file is not imported by the project; `mlxio.sandbox.runner` reads its source and runs it as
`python -I -S -B -c <this source> ROLE ARGS_JSON` in each of two separate sandboxes:

- role "worker" (untrusted): sets its resource limits, reads the candidate code from stdin,
  executes it, then serves calls `{"call": name, "args": [...], "kwargs": {...}}` read from fd
  `req` with replies `{"ret": value}` / `{"exc": [type_name, message]}` written to fd `rep`.
  Everything this process says is untrusted data.
- role "judge" (trusted): reads `{"nonce", "prelude", "test", "entry_point"}` from stdin, runs
  the problem's prelude and test code, calls `check(stub)` where `stub` forwards each call to
  the worker and decodes the reply into plain builtin values, and writes the verdict with the
  nonce on fd `res`. The judge never executes the candidate's code and never receives an
  object the candidate built: only JSON of plain types, decoded by the judge itself.

Messages are length-prefixed JSON (4-byte big-endian length). Only the standard library is used.
"""

import builtins
import json
import os
import resource
import struct
import sys

MAX_MESSAGE = 16 * 1024 * 1024  # bytes; a reply bigger than this is a failure, not a crash
MAX_DEPTH = 200  # nesting of a returned value


def set_limits(lim):
    """Resource limits for this process and every process it starts (before any job code)."""
    mb = 1024 * 1024
    for res, value in (
        (resource.RLIMIT_AS, lim["memory_mb"] * mb),
        (resource.RLIMIT_NPROC, lim["max_processes"]),
        (resource.RLIMIT_FSIZE, lim["max_file_mb"] * mb),
        # CPU seconds: a backstop if the parent's wall-clock kill never comes.
        (resource.RLIMIT_CPU, int(lim["timeout_s"]) + 2),
        (resource.RLIMIT_CORE, 0),
    ):
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            if sys.platform != "darwin":  # macOS refuses some (RLIMIT_AS); Linux must not
                raise


# ---------------------------------------------------------------- codec (plain values only)

_BASES = (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)


def encode(v, depth=0):
    """Plain Python value -> JSON-able tree (run by the untrusted worker).

    Instances of builtin subclasses (a namedtuple, a Counter, an int with a custom __eq__)
    are sent as their base type's data: the judge rebuilds plain objects from it, so an
    overridden method never runs in the judge. Any other type is refused.
    """
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(v)
    if t not in _BASES and v is not None and t is not range:
        base = next((b for b in _BASES if isinstance(v, b)), None)
        if base is None:
            raise TypeError(f"value of type {t.__name__} cannot leave the sandbox "
                            "(builtin types only)")
        t, v = base, (dict(v.items()) if base is dict else base(v))
    if v is None or t is bool or t is int or t is str or t is float:
        return v
    if t is list or t is tuple or t is set or t is frozenset:
        tag = {list: "l", tuple: "t", set: "s", frozenset: "f"}[t]
        return {tag: [encode(x, depth + 1) for x in v]}
    if t is dict:
        return {"d": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}
    if t is bytes:
        return {"b": v.hex()}
    if t is complex:
        return {"c": [v.real, v.imag]}
    return {"r": [v.start, v.stop, v.step]}  # range


def decode(v, depth=0):
    """Inverse of `encode`, run by the judge: builds fresh builtin objects only."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(v)
    if v is None or t is bool or t is int or t is str or t is float:
        return v
    if t is not dict or len(v) != 1:
        raise ValueError("malformed value from the candidate process")
    (tag, x), = v.items()
    if tag == "b":
        return bytes.fromhex(x)
    if tag == "c":
        return complex(float(x[0]), float(x[1]))
    if tag == "d":
        return {decode(k, depth + 1): decode(y, depth + 1) for k, y in x}
    if tag == "r":
        return range(*(int(i) for i in x))
    items = [decode(y, depth + 1) for y in x]
    ctor = {"l": list, "t": tuple, "s": set, "f": frozenset}.get(tag)
    if ctor is None:
        raise ValueError(f"unknown tag {tag!r} from the candidate process")
    return ctor(items)


class PeerGone(Exception):
    """The other process closed its pipe (exited, crashed or was killed)."""


def send(fd, msg):
    data = json.dumps(msg).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        n = os.write(fd, data)
        data = data[n:]


def recv(fd):
    def read_exact(n):
        buf = b""
        while len(buf) < n:
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise PeerGone("candidate process exited or closed its pipe")
            buf += chunk
        return buf

    (n,) = struct.unpack(">I", read_exact(4))
    if n > MAX_MESSAGE:
        raise ValueError(f"message of {n} bytes exceeds {MAX_MESSAGE}")
    return json.loads(read_exact(n))


# ---------------------------------------------------------------- worker (untrusted)

def worker(args):
    req, rep = args["req"], args["rep"]
    code = sys.stdin.read()
    sys.stdin.close()
    ns = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        exec(compile(code, "<candidate>", "exec"), ns)
    except BaseException as err:  # noqa: BLE001  (the candidate may raise anything)
        send(rep, {"load_error": f"{type(err).__name__}: {err}"[:2000]})
        return
    send(rep, {"names": [k for k, v in ns.items() if callable(v) and not k.startswith("__")]})
    while True:
        try:
            msg = recv(req)
        except PeerGone:
            return
        try:
            fn = ns[msg["call"]]
            out = fn(*decode(msg["args"]), **decode(msg["kwargs"]))
            reply = {"ret": encode(out)}
        except BaseException as err:  # noqa: BLE001
            reply = {"exc": [type(err).__name__, str(err)[:2000]]}
        send(rep, reply)


# ---------------------------------------------------------------- judge (trusted)

class CandidateError(Exception):
    """The candidate raised an exception that may not cross into the judge as itself."""


def _exception_from(name, message):
    """A builtin exception of that name, so tests expecting e.g. ValueError still work.

    Exceptions with control-flow meaning are never re-raised as themselves: a StopIteration
    raised inside `map(candidate, xs)` would end `all(...)` early, as True."""
    cls = getattr(builtins, str(name), None)
    if (isinstance(cls, type) and issubclass(cls, Exception)
            and not issubclass(cls, (StopIteration, StopAsyncIteration))):
        return cls(str(message))
    return CandidateError(f"{name}: {message}")


def mark(res, what):
    """A progress mark for the parent, telling what the judge is doing should time run out:
    "L" the problem's code loaded (now waiting for the candidate's), "H" the candidate loaded
    (the tests run), "C" a call into the candidate pending, "R" its reply received."""
    os.write(res, what.encode())


def make_stub(name, req, rep, res, raised):
    """A function that calls the candidate's `name` in the worker; every exception it raises
    is recorded in `raised` (the candidate's, not the tests' own)."""
    def stub(*args, **kwargs):
        mark(res, "C")
        try:
            send(req, {"call": name, "args": encode(list(args)), "kwargs": encode(kwargs)})
            reply = recv(rep)
        except BaseException as err:
            raised.append(err)
            raise
        mark(res, "R")
        if "ret" in reply:
            try:
                return decode(reply["ret"])
            except BaseException as err:
                raised.append(err)
                raise
        exc_name, message = reply["exc"]
        err = _exception_from(exc_name, message)
        raised.append(err)
        raise err

    stub.__name__ = stub.__qualname__ = name
    return stub


def free_names(source):
    import ast  # noqa: PLC0415

    return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}


def judge(args):
    req, rep, res = args["req"], args["rep"], args["res"]
    job = json.loads(sys.stdin.read())
    sys.stdin.close()

    def verdict(status, detail="", judge_fault=False):
        data = json.dumps({"nonce": job["nonce"], "status": status, "detail": str(detail)[:2000],
                           "judge_fault": judge_fault})
        os.write(res, b"V" + data.encode())  # small (detail capped); read to EOF by the parent

    ns = {"__name__": "__judge__", "__builtins__": builtins}
    try:  # the problem's own code first: its hang or error is never the candidate's
        exec(compile(job["prelude"], "<prelude>", "exec"), ns)
        exec(compile(job["test"], "<test>", "exec"), ns)
        check = ns["check"]
    except BaseException as err:  # noqa: BLE001  (the dataset's own code is broken)
        return verdict("infra", f"problem test code failed to load: {type(err).__name__}: {err}")
    mark(res, "L")
    try:
        hello = recv(rep)
    except PeerGone:
        return verdict("error", "candidate process exited before loading")
    except ValueError as err:
        return verdict("error", err)
    if "load_error" in hello or not isinstance(hello.get("names"), list):
        return verdict("error", hello.get("load_error", "malformed hello"))
    mark(res, "H")
    # Names the test uses but neither it nor the prelude defines (helpers the candidate
    # defines, e.g. `poly` when no prelude is given) are called through the worker too.
    candidate_names = {str(n) for n in hello["names"]}
    raised = []  # exceptions that came from the candidate (through a stub)
    for name in free_names(job["test"]) - set(ns) - set(dir(builtins)):
        if name in candidate_names:
            ns[name] = make_stub(name, req, rep, res, raised)
    stub = make_stub(job["entry_point"], req, rep, res, raised)
    ns[job["entry_point"]] = stub
    try:
        check(stub)
    except PeerGone as err:
        return verdict("failed", err)
    except AssertionError as err:
        return verdict("failed", f"AssertionError: {err}")
    except BaseException as err:  # noqa: BLE001
        if any(err is e for e in raised):  # the candidate's exception, passed through
            return verdict("failed", f"{type(err).__name__}: {err}")
        # the tests' own code raised: a broken test, or one tripped by a wrong answer
        return verdict("infra", f"the tests raised {type(err).__name__}: {err}", judge_fault=True)
    return verdict("passed")


if __name__ == "__main__":
    _role, _args = sys.argv[1], json.loads(sys.argv[2])
    set_limits(_args["limits"])
    {"worker": worker, "judge": judge}[_role](_args)
