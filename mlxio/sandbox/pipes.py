"""What the two sandboxed processes said, read into a `Verdict`: their pipes multiplexed
(stdin fed, output tails kept, the judge's progress marks and nonce-signed result collected, the
output and disk limits enforced: `_Outputs`), and the status decided from those alone
(`_decide`, outside the sandbox; `mlxio.sandbox.runner` has the threat model)."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time

import attrs

from mlxio.sandbox.backend import dir_bytes

STATUSES = ("passed", "failed", "timeout", "error", "infra")
_TAIL = 4096  # bytes of stdout/stderr kept in a Verdict


@attrs.frozen(kw_only=True)
class Verdict:
    """Outcome of one sandboxed run; `status` is one of STATUSES, decided outside the sandbox."""

    status: str
    # the worker's (candidate's) exit status (-9: killed once the verdict was in); never
    # decides the status
    returncode: int | None = None
    duration_s: float = 0.0
    stdout: str = ""  # tails of the candidate's output, for debugging
    stderr: str = ""
    detail: str = ""
    run_id: str = ""  # also in MLXIO_SANDBOX=<run_id> in every sandboxed process's environment
    backend: str = ""
    # "infra" because the problem's own test code misbehaved after the candidate answered
    # (hung, flooded its output, raised something other than an assertion or the
    # candidate's exception): possibly provoked by the candidate's answers. `fault_status` is
    # the candidate's status should the tests prove sound (`mlxio.rl.execution` runs the
    # problem's reference solution to tell).
    judge_fault: bool = False
    fault_status: str = ""
    # "infra" because the problem's own prelude or tests did not load (raised, or ran out of
    # time before the judge waited for the candidate): no candidate can pass this problem
    problem_fault: bool = False

    @property
    def passed(self) -> bool:
        return self.status == "passed"


class _Capture:
    """Reads one pipe: keeps the last `_TAIL` bytes and counts the total."""

    def __init__(self) -> None:
        self.tail = b""
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        self.tail = (self.tail + data)[-_TAIL:]

    def text(self) -> str:
        return self.tail.decode(errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Outputs:
    """Multiplexes the children's pipes: feeds stdin, captures output, collects the verdict."""

    def __init__(self, worker, judge, res_r: int, worker_in: bytes, judge_in: bytes) -> None:
        self.sel = selectors.DefaultSelector()
        self.captures = {k: _Capture() for k in ("worker_out", "worker_err", "judge_out",
                                                 "judge_err")}
        self.result = b""
        self.progress = ""  # the judge's last progress mark before its verdict
        self.in_verdict = False
        self.overflow = False
        self.judge_overflow = False
        self.quota: tuple[str, int] | None = None  # (work dir, bytes): polled where no tmpfs caps it
        self.over_quota = False
        self._next_quota_check = 0.0
        self.files = [f for p in (worker, judge) for f in (p.stdin, p.stdout, p.stderr)]
        self.pending = {worker.stdin.fileno(): [worker.stdin, worker_in],
                        judge.stdin.fileno(): [judge.stdin, judge_in]}
        for name, f in (("worker_out", worker.stdout), ("worker_err", worker.stderr),
                        ("judge_out", judge.stdout), ("judge_err", judge.stderr)):
            os.set_blocking(f.fileno(), False)
            self.sel.register(f.fileno(), selectors.EVENT_READ, (name, f))
        os.set_blocking(res_r, False)
        self.res_r = res_r
        self.sel.register(res_r, selectors.EVENT_READ, ("result", None))
        for fd, (f, _) in self.pending.items():
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_WRITE, ("stdin", f))

    def pump(self, deadline: float, cap: int, worker, judge) -> bool:
        """Moves data until the verdict pipe closes (-> False) or the deadline (-> True).
        Output past `cap` kills the process that wrote it (the worker: its fault; the judge:
        the tests' fault)."""
        while self.sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            if worker is not None and self.quota is not None and time.monotonic() >= self._next_quota_check:
                self._next_quota_check = time.monotonic() + 0.05
                if dir_bytes(self.quota[0]) > self.quota[1]:
                    self.over_quota = True
                    _kill_group(worker)
            for key, _ in self.sel.select(timeout=min(remaining, 0.05 if self.quota else 0.25)):
                name, f = key.data
                if name == "stdin":
                    self._write(key.fd, f)
                    continue
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    self.sel.unregister(key.fd)
                    if name == "result":
                        return False
                    continue
                if name == "result":
                    self._feed_result(data)
                    continue
                self.captures[name].feed(data)
                if self.captures[name].total <= cap:
                    continue
                if worker is not None and name.startswith("worker") and not self.overflow:
                    self.overflow = True
                    _kill_group(worker)
                elif judge is not None and name.startswith("judge") and not self.judge_overflow:
                    self.judge_overflow = True
                    _kill_group(judge)
        return False

    def _feed_result(self, data: bytes) -> None:
        """The judge's progress marks (one byte each, see child.py), then b"V" and the
        verdict's JSON."""
        if not self.in_verdict:
            head, mark, data = data.partition(b"V")
            if head:
                self.progress = head[-1:].decode()
            if not mark:
                return
            self.in_verdict = True
        self.result = (self.result + data)[-65536:]

    def _write(self, fd: int, f) -> None:
        entry = self.pending[fd]
        try:
            n = os.write(fd, entry[1][:65536])
        except BlockingIOError:
            return
        except OSError:  # the child closed stdin or died: nothing more to send
            n = len(entry[1])
        entry[1] = entry[1][n:]
        if not entry[1]:
            self.sel.unregister(fd)
            f.close()

    def close(self) -> None:
        for key in list(self.sel.get_map().values()):
            self.sel.unregister(key.fd)
        self.sel.close()
        os.close(self.res_r)
        for f in self.files:
            try:
                f.close()
            except OSError:  # a stdin pipe whose reader died with bytes unsent
                pass


# What the judge was doing (its last progress mark, child.py) when time ran out: "" loading
# the problem's prelude and tests; "L" waiting for the candidate's code to load; "H" / "R"
# the tests running their own code; "C" a call into the candidate pending.
_CANDIDATE_TIME = ("L", "C")


def _decide(out: _Outputs, nonce: str, timed_out: bool, worker, **meta) -> Verdict:
    cap = out.captures
    common = dict(returncode=worker.returncode, stdout=cap["worker_out"].text(),
                  stderr=cap["worker_err"].text(), **meta)
    try:
        result = json.loads(out.result.decode()) if out.in_verdict else None
        ok = isinstance(result, dict) and result.get("nonce") == nonce
    except ValueError:
        result, ok = None, False
    if out.overflow:
        return Verdict(status="error", detail="candidate exceeded the output limit", **common)
    if out.over_quota:
        return Verdict(status="error", detail="candidate exceeded the disk quota", **common)
    if out.judge_overflow:
        return Verdict(status="infra", judge_fault=True,
                       detail="the problem's tests exceeded the output limit", **common)
    if timed_out:  # a verdict drained after the kill may describe the kill itself
        if out.progress == "":
            return Verdict(status="infra", problem_fault=True, detail="the problem's prelude or tests did not "
                           "load within the wall-clock limit", **common)
        if out.progress not in _CANDIDATE_TIME:
            return Verdict(status="infra", judge_fault=True, fault_status="timeout",
                           detail="wall-clock limit reached in the tests' own code (no call "
                                  "into the candidate pending)", **common)
        return Verdict(status="timeout", detail="wall-clock limit reached", **common)
    if ok and result.get("status") in STATUSES:
        fault = bool(result.get("judge_fault"))
        return Verdict(status=result["status"], detail=str(result.get("detail", "")),
                       judge_fault=fault, fault_status="failed" if fault else "",
                       problem_fault=result["status"] == "infra" and not fault, **common)
    why = "no verdict from the judge" if result is None else "judge verdict without valid nonce"
    return Verdict(status="infra", detail=f"{why}; judge stderr: {cap['judge_err'].text()}",
                   **common)
