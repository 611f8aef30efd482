"""Read back what the trackers wrote, with their own readers and schemas.

TensorBoard: `EventAccumulator` (tensorboard's reader). Weights & Biases 0.31 has no public
reader for an offline run's `run-*.wandb` file (its Go core writes it: LevelDB log framing, a
7-byte `:W&B` header, 32 KiB blocks of CRC'd chunks); the records in it are wandb's own
`wandb_internal_pb2.Record` protobufs, decoded here with wandb's schema.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: sorted((e.step, e.value) for e in events.Scalars(tag))
            for tag in events.Tags()["scalars"]}


def wandb_records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # block trailer
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_history(run_dir: Path) -> list[dict]:
    """The `history` rows ({key: value, "_step": n}) of the offline runs under `run_dir`."""
    rows = []
    for path in sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows
