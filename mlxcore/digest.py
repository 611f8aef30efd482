"""Content hashing: the project's one way to turn text into a stable number (a seed, a split)."""

from __future__ import annotations

import hashlib


def hashed_int(text: str, nbytes: int) -> int:
    """The first `nbytes` bytes of sha256(text) as a big-endian unsigned int: a seed or a split
    decision that depends on the text alone (the same on every machine and in every process)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:nbytes], "big")
