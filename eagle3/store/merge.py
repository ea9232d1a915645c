"""A dataset extracted in parts (one per node) and merged into one.

Multi-node extraction runs extract.py once per node with ``shard_index=i num_shards=n``.
Node i captures the samples whose id hashes to i (``owner_shard``: independent of order
and of the other samples, so every node agrees without talking to the others) into a
normal dataset directory beside the final one, ``<dataset dir>.part-<i>-of-<n>``, with
the same fingerprint. ``merge_parts`` then builds the final directory from the parts:
their shard files are hard-linked (copied across filesystems) under new sequential names,
and one manifest gets the combined counts, sample ids and validation ids, the summed token
frequencies, and the draft vocabularies rebuilt from those sums (a vocabulary of one part
is not the vocabulary of the whole). The directory is assembled under a temporary name
and renamed into place, so a killed merge leaves no half dataset; re-running it redoes it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch

from eagle3.data.vocab import build_draft_vocab
from eagle3.store.layout import (
    MANIFEST,
    TOKEN_FREQ,
    Manifest,
    ShardInfo,
    StoreError,
    shard_name,
    vocab_name,
)
from eagle3.store.shard_file import inspect_shard, manifest_identity
from eagle3.store.vocab_files import check_token_freq, load_tensors, save_token_freq, save_vocab
from eagle3.util.atomic import replace_dir
from eagle3.util.locks import DirLock, lock_wait_s

MERGING_SUFFIX = ".merging"


def owner_shard(sample_id: str, num_shards: int) -> int:
    """Which part (0..num_shards-1) captures this sample: a stable hash of its id."""
    if num_shards < 1:
        raise StoreError(f"num_shards: expected >= 1, got {num_shards}")
    return int(hashlib.sha256(str(sample_id).encode()).hexdigest()[:16], 16) % int(num_shards)


def part_dir(dataset_dir: str | Path, shard_index: int, num_shards: int) -> Path:
    if not 0 <= int(shard_index) < int(num_shards):
        raise StoreError(f"shard_index: expected 0..{int(num_shards) - 1}, got {shard_index}")
    d = Path(dataset_dir)
    return d.with_name(f"{d.name}.part-{int(shard_index)}-of-{int(num_shards)}")


def _check_parts(final: Path, parts: list[Path]) -> list[Manifest]:
    manifests: list[Manifest] = []
    missing: list[str] = []
    for i, p in enumerate(parts):
        m = Manifest.read_complete(p)
        if m is None:
            missing.append(f"shard_index={i} ({p}: {'incomplete' if (p / MANIFEST).exists() else 'missing'})")
        else:
            manifests.append(m)
    if missing:
        raise StoreError(
            f"{final}: cannot merge {len(parts)} parts, not finished: {', '.join(missing)}. Run "
            f"`python extract.py <same overrides> shard_index=<i> num_shards={len(parts)}` for each, then merge again"
        )
    first = manifests[0]
    _check_storage(parts, manifests)
    if not final.name.endswith(first.fingerprint):
        raise StoreError(f"{parts[0]}: fingerprint: expected the one in {final.name!r}, got {first.fingerprint}")
    seen: dict[str, int] = {}
    for i, (p, m) in enumerate(zip(parts, manifests)):
        for field in ("fingerprint", "layer_ids", "hidden_size", "dtype", "fingerprint_inputs"):
            if getattr(m, field) != getattr(first, field):
                raise StoreError(
                    f"{p / MANIFEST}: {field}: expected {getattr(first, field)} (as part 0), "
                    f"got {getattr(m, field)}; the parts come from different configs"
                )
        for sid in m.sample_ids:
            if sid in seen:
                raise StoreError(
                    f"{p}: sample {sid!r} is also in part {seen[sid]}; parts must be disjoint "
                    "(same num_shards on every node?)"
                )
            seen[sid] = i
    return manifests


def _check_storage(parts: list[Path], manifests: list[Manifest]) -> None:
    """One storage format in all parts, refused by name before the fingerprint (which holds it) is
    found to differ."""
    want = manifests[0].storage
    for p, m in zip(parts, manifests):
        if m.storage != want:
            raise StoreError(
                f"{p / MANIFEST}: storage: expected {want} (as part 0, {parts[0]}), got {m.storage}; a dataset "
                "holds one storage format: extract every part with the same capture.storage and capture.teacher_topk"
            )


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # no bytes move: the part's shard becomes the dataset's
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(src, dst)


def merge_parts(
    dataset_dir: str | Path,
    num_shards: int,
    *,
    draft_vocab_sizes: Iterable[int] = (),
    remove_parts: bool = True,
    verify: str = "fast",
) -> Manifest:
    """Build the complete dataset ``dataset_dir`` from its ``num_shards`` complete parts.

    ``draft_vocab_sizes``: vocabularies to build from the summed token counts (with any the
    parts carry). ``remove_parts``: delete the part directories afterwards (their shards
    live on, hard-linked, in the dataset). A dataset already complete is left as it is.
    """
    final = Path(dataset_dir)
    parts = [part_dir(final, i, num_shards) for i in range(int(num_shards))]
    final.parent.mkdir(parents=True, exist_ok=True)
    # one merge at a time; a second waits (naming the first, bounded), then finds it done
    lock_path = final.with_name(f"{final.name}.merge.lock")
    with DirLock(lock_path, f"{final}: another merge of its {num_shards} parts is running", wait_s=lock_wait_s()):
        done = Manifest.read_complete(final)
        if done is None:
            if final.exists() and any(final.glob("shard-*.safetensors")):
                raise StoreError(
                    f"{final}: holds an unfinished single-run extraction; finish it (extract.py without "
                    "num_shards) or delete it before merging parts into it"
                )
            done = _merge(final, parts, _check_parts(final, parts), draft_vocab_sizes, verify)
        if remove_parts:
            for p in parts:
                m = Manifest.read_complete(p)
                if p.exists() and (m is None or m.fingerprint == done.fingerprint):
                    shutil.rmtree(p)
        # safe while held: anyone blocked on this lock finds the dataset complete when they get it
        lock_path.unlink(missing_ok=True)
    return done


def _merge(
    final: Path, parts: list[Path], manifests: list[Manifest], draft_vocab_sizes: Iterable[int], verify: str
) -> Manifest:
    first = manifests[0]
    ident = manifest_identity(first)
    tmp = final.with_name(final.name + MERGING_SUFFIX)
    if tmp.exists():  # a killed merge: only links and small files, redo it
        shutil.rmtree(tmp)
    tmp.mkdir()
    shards: list[ShardInfo] = []
    freq: torch.Tensor | None = None
    sizes = {int(v) for v in draft_vocab_sizes}
    for p, m in zip(parts, manifests):
        for info in m.shards:
            inspect_shard(p / info.file, ident, info, verify)
            new = ShardInfo(**{**info.__dict__, "file": shard_name(len(shards))})
            _link_or_copy(p / info.file, tmp / new.file)
            shards.append(new)
        if not m.token_freq:
            raise StoreError(f"{p / MANIFEST}: token_freq: expected a file name, got none")
        counts = check_token_freq(load_tensors(p / m.token_freq, ("token_freq",))["token_freq"])
        if freq is not None and counts.shape != freq.shape:
            raise StoreError(f"{p / m.token_freq}: shape: expected {list(freq.shape)}, got {list(counts.shape)}")
        freq = counts if freq is None else freq + counts
        sizes |= {int(v) for v in m.vocabs}
    assert freq is not None  # every part has counts, and there is at least one (manifests[0])
    save_token_freq(tmp / TOKEN_FREQ, freq)
    merged = Manifest(
        fingerprint=first.fingerprint,
        fingerprint_inputs=first.fingerprint_inputs,
        layer_ids=list(first.layer_ids),
        hidden_size=first.hidden_size,
        dtype=first.dtype,
        storage=first.storage,
        shards=shards,
        sample_ids=[s for m in manifests for s in m.sample_ids],
        val_ids=sorted(v for m in manifests for v in m.val_ids),
        token_freq=TOKEN_FREQ,
        provenance=dict(first.provenance),
    )
    for V in sorted(sizes):
        d2t, t2d = build_draft_vocab(freq, V)
        save_vocab(tmp / vocab_name(int(d2t.shape[0])), int(d2t.shape[0]), d2t, t2d)
        merged.vocabs[str(int(d2t.shape[0]))] = vocab_name(int(d2t.shape[0]))
    merged.recount()
    merged.complete = True
    merged.write(tmp)
    # an existing final is only an empty shell (a writer's first manifest, no shards): replaced
    replace_dir(tmp, final, point="merge")
    return merged
