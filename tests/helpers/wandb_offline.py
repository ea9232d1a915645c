"""Read an offline W&B run file (run-*.wandb) back: what was really logged, not what we
asked for. The file is a LevelDB-style log (32 KiB blocks of checksummed chunks) of
protobuf Records; wandb ships the protobuf schema."""

from __future__ import annotations

import json
import struct
from pathlib import Path

_BLOCK = 32768
_HEADER = 7  # ":W&B" + magic (2 bytes) + version (1 byte)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    pos, parts = _HEADER, []
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # the writer is still appending this chunk
            return
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        if kind in (_FULL, _FIRST):
            parts = [chunk]
        else:
            parts.append(chunk)
        if kind in (_FULL, _LAST):
            rec = pb.Record()
            rec.ParseFromString(b"".join(parts))
            yield rec


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def read_run(run_dir: Path, wait_for: str | None = None, timeout: float = 30.0) -> dict:
    """{'history': [ {key: value} per row ], 'summary': {...}, 'config': {...}, 'group', 'tags'}

    wandb (0.31, offline) may still be writing the file when finish() returns: with
    ``wait_for``, re-read until that summary key appears (or the timeout passes)."""
    import time

    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + timeout
    while True:
        try:
            out = _read_once(run_dir)
        except DecodeError:  # read mid-write (a record not yet whole): read again
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
            continue
        if wait_for is None or wait_for in out["summary"] or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def _read_once(run_dir: Path) -> dict:
    (path,) = list(Path(run_dir).glob("run-*.wandb"))
    out = {"history": [], "summary": {}, "config": {}, "group": None, "tags": []}
    for rec in _records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            out["summary"].update({_key(i): json.loads(i.value_json) for i in rec.summary.update})
        elif kind == "config":
            out["config"].update({_key(i): json.loads(i.value_json) for i in rec.config.update})
        elif kind == "run":
            out["group"], out["tags"] = rec.run.run_group, list(rec.run.tags)
            out["config"].update({_key(i): json.loads(i.value_json) for i in rec.run.config.update})
    return out
