"""An atomic write never renames over anything but a regular file: a device node, FIFO,
socket, directory or symlink at the output path is refused with one line, and left as it was."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mlxio.atomic import replace_file, write_json_atomic, write_text_atomic
from mlxio.errors import DiskError

REPO = Path(__file__).resolve().parents[2]


def _specials(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock.json"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    (tmp_path / "dir.json").mkdir()
    link = tmp_path / "null-link.json"
    link.symlink_to("/dev/null")
    return {"/dev/null": Path("/dev/null"), "/dev/full": Path("/dev/full"), "fifo": fifo,
            "socket": sock_path, "dir": tmp_path / "dir.json", "link to /dev/null": link}


def test_special_files_are_refused_and_unchanged(tmp_path):
    for name, path in _specials(tmp_path).items():
        before = os.lstat(path)
        with pytest.raises(DiskError, match="not a regular file"):
            write_json_atomic(path, {"x": 1})
        after = os.lstat(path)
        assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev), name
        tmp = tmp_path / f".tmp-{name.replace('/', '_')}"
        tmp.write_text("x")
        with pytest.raises(DiskError):
            replace_file(tmp, path)
        assert not tmp.exists()  # the temp file is cleaned up
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_regular_files_are_replaced_and_links_refused(tmp_path):
    target = tmp_path / "out.json"
    write_text_atomic(target, "old")
    write_text_atomic(target, "new")
    assert target.read_text() == "new"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with pytest.raises(DiskError, match="symbolic link"):
        write_text_atomic(link, "through the link")
    assert link.is_symlink() and target.read_text() == "new"  # never written through a link
    write_json_atomic(tmp_path / "fresh" / "a.json", [1])
    assert (tmp_path / "fresh" / "a.json").read_text().strip() == "[\n  1\n]"


def test_code_search_output_to_a_device_is_one_line(tmp_path):
    """The CLI refuses `--output /dev/full` before any work (was: renamed a file over it)."""
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": "1", "query": "add numbers"}\n')
    before = os.stat("/dev/full")
    proc = subprocess.run([sys.executable, "-m", "recipes.code_search", "search", "--index",
                           str(tmp_path / "index"), "--queries", str(queries), "--output", "/dev/full"],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    after = os.stat("/dev/full")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert "its path is a character device, not a regular file (/dev/full)" in lines[0]
