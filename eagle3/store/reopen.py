"""Opening a dataset directory for writing: its manifest checked against this run's identity,
then every shard a crash may have left behind sorted out (``ShardWriter`` calls both).

What a reopen finds and does: temp files (a crash mid-write) are removed; a listed shard that is
missing, short or corrupt is deleted and, when the manifest knows its samples, kept as a slot to
redo in place (``store/redo.py``); a valid shard renamed into place but not yet listed (a crash
between the rename and the manifest update) is adopted. The manifest is rewritten only if that
changed anything, and a dataset with a shard dropped or adopted is no longer complete.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3.store.fingerprint import canonical
from eagle3.store.layout import (
    MANIFEST,
    SHARD_RE,
    TMP_MARK,
    FingerprintMismatchError,
    Manifest,
    ShardInfo,
    StoreError,
    dtype_name,
)
from eagle3.store.redo import RedoSlots
from eagle3.store.shard_file import ShardIdentity, inspect_shard

log = logging.getLogger(__name__)


def open_manifest(directory: Path, ident: ShardIdentity, fingerprint_inputs: Mapping[str, Any]) -> Manifest:
    """The manifest in ``directory``, or a new one recording this identity first (so a later run
    with other inputs refuses); a manifest of another fingerprint or shape is refused by name."""
    if not (directory / MANIFEST).exists():
        m = Manifest(
            fingerprint=ident.fingerprint,
            fingerprint_inputs=canonical(fingerprint_inputs),
            layer_ids=list(ident.layer_ids),
            hidden_size=ident.hidden_size,
            dtype=dtype_name(ident.dtype),
            storage=ident.storage,
        )
        m.write(directory)
        return m
    m = Manifest.read(directory)
    if m.fingerprint != ident.fingerprint:
        theirs, ours = m.fingerprint_inputs, canonical(fingerprint_inputs)
        if theirs.get("schema_version") != ours.get("schema_version"):
            # a dataset named by an older fingerprint scheme: readable as it is, but this version
            # writes only datasets of its own scheme, so a damaged one is not repaired in place
            raise FingerprintMismatchError(
                f"{directory}: cannot be repaired or extended in place: it was written under fingerprint "
                f"scheme {theirs.get('schema_version')} (this version writes scheme {ours.get('schema_version')}); "
                "nothing in it was changed. Move it aside (or delete it) and re-run the same extract.py "
                "command: it captures the dataset again under this version's name"
            )
        diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        raise FingerprintMismatchError(
            f"{directory}: fingerprint: expected {ident.fingerprint} (this config), got "
            f"{m.fingerprint} (the dataset there); inputs that differ: {diff}. Refusing to mix "
            "two datasets: use another directory or delete this one."
        )
    for name, want, got in (
        ("layer_ids", list(ident.layer_ids), m.layer_ids),
        ("hidden_size", ident.hidden_size, m.hidden_size),
        ("dtype", dtype_name(ident.dtype), m.dtype),
        ("storage", ident.storage, m.storage),
    ):
        if want != got:
            raise FingerprintMismatchError(
                f"{directory / MANIFEST}: {name}: expected {want}, got {got} (same fingerprint: "
                "the fingerprint inputs must include layer ids, hidden size, dtype and the storage format)"
            )
    return m


@dataclass
class Reopened:
    """What ``recover`` found; the manifest it was given now lists only the valid shards."""

    removed_temp: list[str] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (file, why) of shards found broken
    adopted: list[str] = field(default_factory=list)  # shards found renamed but not yet in the manifest
    ids_by_file: dict[str, list[str]] = field(default_factory=dict)  # each kept shard's sample ids, in order
    redo: RedoSlots = field(default_factory=RedoSlots)  # broken listed shards, rewritten once their samples are back


def recover(directory: Path, m: Manifest, ident: ShardIdentity, verify: str, damaged: set[str]) -> Reopened:
    """Check every shard in ``directory`` (``verify``: "full" or "fast", see ``inspect_shard``)
    and bring ``m`` in line with what is valid there. The caller holds the dataset's lock, so a
    temp file is nobody's. ``damaged``: listed shards the caller already found broken (not
    inspected twice)."""
    found = Reopened()
    for p in sorted(directory.iterdir()):
        if TMP_MARK in p.name:
            p.unlink()
            found.removed_temp.append(p.name)
            log.warning("%s: removed leftover temp file %s", directory, p.name)
    before = (list(m.sample_ids), [s.file for s in m.shards], m.complete)
    kept: list[ShardInfo] = []
    ids: list[str] = []
    seen: set[str] = set()
    listed = {s.file for s in m.shards}
    listed_ids = m.ids_by_shard()

    def keep(info: ShardInfo, sample_ids: list[str]) -> None:
        kept.append(info)
        ids.extend(sample_ids)
        seen.update(sample_ids)
        found.ids_by_file[info.file] = list(sample_ids)

    def drop(file: str, why: str) -> None:
        log.warning("%s: dropping shard %s, its samples will be captured again: %s", directory, file, why)
        found.dropped.append((file, why))
        (directory / file).unlink(missing_ok=True)

    for info in m.shards:
        try:
            if info.file in damaged:
                raise StoreError(f"{info.file}: found damaged before opening")
            info, sample_ids = inspect_shard(directory / info.file, ident, info, verify)
            if seen & set(sample_ids):
                raise StoreError(f"{info.file}: sample ids already in an earlier shard")
        except StoreError as e:
            drop(info.file, str(e))
            slot = listed_ids.get(info.file)
            if slot and not seen & set(slot):  # its samples are known: redo it in place
                keep(info, slot)
                found.redo.add(info.file, slot)
            continue
        keep(info, sample_ids)
    for p in sorted(directory.glob("shard-*.safetensors")):
        if p.name in listed or not SHARD_RE.match(p.name):
            continue
        try:  # renamed into place, then killed before the manifest update
            info, sample_ids = inspect_shard(p, ident, None, verify)
            if seen & set(sample_ids):
                raise StoreError(f"{p.name}: sample ids already in another shard")
        except StoreError as e:
            drop(p.name, f"unlisted shard: {e}")
            continue
        keep(info, sample_ids)
        found.adopted.append(p.name)
        log.warning("%s: adopted shard %s (written before a crash, not yet in the manifest)", directory, p.name)
    m.shards, m.sample_ids = kept, ids
    if found.dropped or found.adopted:
        m.complete = False
    m.recount()
    if (list(m.sample_ids), [s.file for s in m.shards], m.complete) != before:
        m.write(directory)
    return found
