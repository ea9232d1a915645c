"""Writing a dataset: shards appended atomically, resumable after a crash at any point.

Order of durability: a shard is written to a temp name, fsynced and renamed; only then is
the manifest (also temp + rename) updated. So at any kill point the directory holds valid
shards, maybe one renamed shard the manifest does not list yet (adopted on reopen), and
maybe temp files (removed on reopen). Reopening (``store/reopen.py``) verifies every shard; a listed one found
missing, short or corrupt is deleted and redone in place (``store/redo.py``: its samples
leave ``done_ids()``, and once captured again they are that shard again). extract.py repairs
a complete dataset this way. One writer per dataset (a lock naming its pid and host, from
``eagle3.util.locks``); a full disk raises ``DiskSpaceError`` and leaves no temp behind.

``background=True`` writes full shards on ``writer_threads`` writer threads (each shard
still shard-then-manifest), so capture continues while shards go to disk and several
shards are hashed and written at once (one thread's sha256 + write + fsync ran at
0.73 GB/s on the H200 machine, below the 1.15 GB/s a Llama-8B capture produces). At most
``writer_threads`` shards wait behind those being written (memory stays bounded); a failed
write is raised by the next ``add``/``flush``/``finish``/``close``, and shards queued after
it are not written. Shards may finish out of order; the manifest lists them (and their
sample ids) by shard index, so the dataset's order does not depend on thread timing.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from eagle3.store.disk import disk_full_as_error, disk_needed_bytes
from eagle3.store.fingerprint import canonical, dataset_fingerprint
from eagle3.store.layout import (
    LOCK,
    MANIFEST,
    SHARD_RE,
    TOKEN_FREQ,
    Manifest,
    ShardInfo,
    StoreError,
    shard_name,
    vocab_name,
)
from eagle3.store.reopen import open_manifest, recover
from eagle3.store.shard_file import ShardIdentity, write_shard
from eagle3.store.storage_format import StorageFormat
from eagle3.store.teacher_topk import TeacherProjection
from eagle3.store.vocab_files import save_token_freq, save_vocab
from eagle3.store.write_options import ExistingShards, WriteOptions
from eagle3.store.writer_threads import BackgroundWrites
from eagle3.util.locks import DirLock, LockHeldError

log = logging.getLogger(__name__)


class ShardWriter(BackgroundWrites):
    """Append captured samples to the dataset in ``directory``; resume what is there.

    ``existing``: how the shards already on disk are checked on open (and which to redo unread).
    ``lock``: the dataset's lock (``LOCK``) when the caller holds it already (released by the
    caller). ``write``: the shards' size, whether they are written on writer threads (see the
    module doc) and where those encode (a GPU: vLLM's capture hands its states over on the host).
    ``storage``: the shards' on-disk format (eagle3/store/storage_format.py),
    encoded on the writer threads as each shard is written; a sample that comes encoded already
    (``encoded``: a GPU capture encodes on the device) is written as it is. A format with the
    teacher's top-k in place of the final layer (``teacher_topk``: eagle3/store/teacher_topk.py)
    encodes a sample that comes with its states as captured with the projection ``set_teacher``
    gave (the target's, known once it is loaded).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        layer_ids: Sequence[int],
        hidden_size: int,
        dtype: torch.dtype,
        fingerprint_inputs: Mapping[str, Any],
        write: WriteOptions = WriteOptions(),
        existing: ExistingShards = ExistingShards(),
        provenance: Mapping[str, Any] | None = None,
        lock: DirLock | None = None,
        storage: StorageFormat = StorageFormat(),
    ):
        shard_max_tokens, writer_threads = write.shard_max_tokens, write.writer_threads
        if shard_max_tokens < 1:
            raise StoreError(f"shard_max_tokens: expected >= 1, got {shard_max_tokens}")
        if writer_threads < 1:
            raise StoreError(f"writer_threads: expected >= 1, got {writer_threads}")
        self.directory = Path(directory)
        self.shard_max_tokens = int(shard_max_tokens)
        self.fingerprint = dataset_fingerprint(fingerprint_inputs)
        if not isinstance(storage, StorageFormat):
            raise StoreError(f"storage: expected a StorageFormat (StorageFormat.from_config), got {storage!r}")
        if storage.check_width(hidden_size):
            raise StoreError(f"storage: {storage.check_width(hidden_size)}")
        ident = (self.fingerprint, tuple(int(i) for i in layer_ids), int(hidden_size), dtype, storage)
        self.ident = ShardIdentity(*ident)
        self.teacher: TeacherProjection | None = None  # set_teacher: encodes captured final layers
        self.encode_device = None if write.encode_device is None else torch.device(write.encode_device)
        self._pending: list[tuple[str, Any]] = []
        self._pending_ids: set[str] = set()
        self._pending_tokens = 0
        self.background = bool(write.background)
        self.writer_threads = int(writer_threads)
        self._state = threading.Lock()  # manifest, _done, _inflight_ids: shared with the writer thread
        self._inflight_ids: set[str] = set()  # handed to the writer thread, not durable yet
        self._jobs: queue.Queue[tuple[int, list[str], list[Any]] | None] | None = None
        self._threads: list[threading.Thread] = []
        self._error: BaseException | None = None  # the writer thread's failure, raised on the next call
        self._error_reported = False
        self._last_info: ShardInfo | None = None
        self.directory.mkdir(parents=True, exist_ok=True)
        if lock is not None and not (lock.held and lock.path == self.directory / LOCK):
            raise StoreError(
                f"lock: expected the held lock {self.directory / LOCK}, got {lock.path} "
                f"({'held' if lock.held else 'not held'})"
            )
        self._owns_lock = lock is None
        self._lock: DirLock | None = self._acquire_lock() if lock is None else lock
        try:
            self.manifest = open_manifest(self.directory, self.ident, fingerprint_inputs)
            # how this run makes the dataset (Manifest.provenance): recorded before any shard
            self.record_provenance(provenance or {})
            self._recover(existing.verify, set(existing.redo))
        except BaseException:
            self._release_lock()
            raise

    def set_teacher(self, teacher: TeacherProjection) -> None:
        """The target's projection that gives the top-k of the dataset's ``teacher_topk`` from a
        captured final layer, on the writer threads. Call it before the first ``add``."""
        k = self.ident.storage.teacher_topk
        if k is None or teacher.k != k:
            raise StoreError(
                f"{self.directory}: set_teacher: expected a projection with k={k} "
                f"(the dataset's teacher_topk), got k={teacher.k}"
            )
        self.teacher = teacher

    def record_provenance(self, values: Mapping[str, Any]) -> None:
        """Add to the manifest's provenance (how this run makes the dataset), written at once
        if it changed. Call it before the first ``add``: no shard is in flight then."""
        recorded = dict(self.manifest.provenance)
        self.manifest.provenance.update(canonical(dict(values), "provenance"))
        if self.manifest.provenance != recorded:
            self.manifest.write(self.directory)

    # ------------------------------------------------------------------ opening

    def _acquire_lock(self) -> DirLock:
        try:
            what = f"{self.directory}: another extraction is writing this dataset"
            return DirLock(self.directory / LOCK, what).acquire()
        except LockHeldError as e:
            raise StoreError(str(e)) from None

    def _release_lock(self) -> None:
        if self._lock is not None and self._owns_lock:
            self._lock.release()
        self._lock = None

    def _recover(self, verify: str, damaged: set[str]) -> None:
        # what reopening found (store/reopen.py: Reopened) is the writer's state from here on
        found = recover(self.directory, self.manifest, self.ident, verify, damaged)
        self.removed_temp, self.dropped, self.adopted = found.removed_temp, found.dropped, found.adopted
        self._ids_by_file = found.ids_by_file  # each listed shard's sample ids, in shard order
        self._redo = found.redo  # listed shards found broken, rewritten once their samples are back
        self._next_index = max((_index(s.file) for s in self.manifest.shards), default=-1) + 1
        self._done = set(self.manifest.sample_ids) - self._redo.waiting()

    # ------------------------------------------------------------------ writing

    @property
    def complete(self) -> bool:
        return self.manifest.complete

    def done_ids(self) -> set[str]:
        """Sample ids already durable in valid shards (skip these when resuming)."""
        with self._state:
            return set(self._done)

    def add(self, sample_id: str, sample: Any) -> None:
        """Queue one ``CapturedSample``; a shard is flushed once shard_max_tokens is reached."""
        if self._lock is None:
            raise StoreError(f"{self.directory}: writer is closed")
        self._raise_writer_error()
        sid = str(sample_id)
        with self._state:
            known = sid in self._done or sid in self._inflight_ids
        if known or sid in self._pending_ids or self._redo.has(sid):
            raise StoreError(f"{self.directory}: sample {sid!r} is already in the dataset (skip done_ids())")
        self._check_sample(sid, sample)
        if self._redo.owns(sid):  # a sample of a shard being redone: rewritten once all are back
            job = self._redo.give(sid, sample)
            if job is not None:
                file, ids, samples = job
                (self._enqueue if self.background else self._write)(_index(file), ids, samples)
            return
        T = int(sample.token_ids.shape[0])
        if self._pending and self._pending_tokens + T > self.shard_max_tokens:
            self._shard_full()
        self._pending.append((sid, sample))
        self._pending_ids.add(sid)
        self._pending_tokens += T
        if self._pending_tokens >= self.shard_max_tokens:
            self._shard_full()

    def _shard_full(self) -> None:
        if self.background:
            self._submit()
        else:
            self.flush()

    def _check_sample(self, sid: str, s: Any) -> None:
        L, H = len(self.ident.layer_ids), self.ident.hidden_size
        T = s.token_ids.shape[0] if s.token_ids.dim() == 1 else -1
        problems = [
            (
                "token_ids",
                "int64 [T]",
                s.token_ids.dtype == torch.int64 and s.token_ids.dim() == 1,
                f"{s.token_ids.dtype} {list(s.token_ids.shape)}",
            ),
            (
                "loss_mask",
                f"bool [{T}]",
                s.loss_mask.dtype == torch.bool and list(s.loss_mask.shape) == [T],
                f"{s.loss_mask.dtype} {list(s.loss_mask.shape)}",
            ),
            *self._state_problems(s, T, L, H),
            ("token_ids", "at least one token", T > 0, "0 tokens"),
        ]
        for field, want, ok, got in problems:
            if not ok:
                raise StoreError(f"{self.directory}: sample {sid!r} {field}: expected {want}, got {got}")

    def _state_problems(self, s: Any, T: int, L: int, H: int) -> list[tuple[str, str, bool, str]]:
        """(field, expected, ok, got) for the sample's states: ``hidden`` [T, L, H] as captured, or
        (``encoded``: encoded on the capture device) this dataset's storage format's tensors."""
        storage = self.ident.storage
        k = storage.teacher_topk
        if getattr(s, "encoded", None) is None:
            ok = s.hidden is not None and s.hidden.dtype == self.ident.dtype and list(s.hidden.shape) == [T, L, H]
            got = "None" if s.hidden is None else f"{s.hidden.dtype} {list(s.hidden.shape)}"
            # captured states need the target's projection for their top-k (set_teacher)
            teacher = (
                "teacher",
                f"the target's projection (set_teacher) to store the top-{k} of captured states",
                k is None or self.teacher is not None,
                "none",
            )
            return [("hidden", f"{self.ident.dtype} [{T}, {L}, {H}]", ok, got), teacher]
        shapes, dtypes = storage.tensor_shapes(T, L, H), storage.tensor_dtypes(self.ident.dtype)
        problems = [
            ("storage", str(storage), s.storage == storage, str(s.storage)),
            ("encoded", f"the tensors {sorted(shapes)}", set(s.encoded) == set(shapes), f"{sorted(s.encoded)}"),
        ]
        for name, t in s.encoded.items():
            if name in shapes:
                ok = t.dtype == dtypes[name] and list(t.shape) == shapes[name] and t.device.type == "cpu"
                want = f"{dtypes[name]} {shapes[name]} on the host"
                problems.append((f"encoded {name}", want, ok, f"{t.dtype} {list(t.shape)} on {t.device}"))
        return problems

    def flush(self) -> ShardInfo | None:
        """Write the queued samples as one shard, then record it in the manifest; with
        ``background``, also wait until every shard handed to the writer thread is durable.
        Returns the last shard written (None if there was nothing to write)."""
        if not self.background:
            self._raise_writer_error()
            if not self._pending:
                return None
            index, ids, samples = self._take_pending()
            return self._write(index, ids, samples)
        self._submit()
        if self._jobs is not None:
            self._jobs.join()
        self._raise_writer_error()
        return self._last_info

    def _take_pending(self) -> tuple[int, list[str], list[Any]]:
        index, ids = self._next_index, [sid for sid, _ in self._pending]
        samples = [s for _, s in self._pending]
        self._next_index += 1
        self._pending, self._pending_ids, self._pending_tokens = [], set(), 0
        return index, ids, samples

    def _write(self, index: int, ids: list[str], samples: list[Any]) -> ShardInfo:
        """The shard, then the manifest that lists it (the durability order)."""
        path = self.directory / shard_name(index)
        tokens = sum(int(s.token_ids.shape[0]) for s in samples)
        L, H = len(self.ident.layer_ids), self.ident.hidden_size
        ident = self.ident
        need = disk_needed_bytes(tokens, L, H, ident.dtype, len(samples), max(tokens, 1), ident.storage)
        with disk_full_as_error(path, need):
            info = write_shard(
                path,
                self.ident,
                ids,
                [s.token_ids for s in samples],
                [s.loss_mask for s in samples],
                [s.hidden if s.encoded is None else s.encoded for s in samples],
                self.teacher,
                self.encode_device,
            )
        with self._state, disk_full_as_error(self.directory / MANIFEST, lambda: len(self.manifest.to_json())):
            m = self.manifest
            self._ids_by_file[info.file] = list(ids)
            files = [s.file for s in m.shards]
            if info.file in files:  # a redone shard takes its old place (same samples, same order)
                m.shards[files.index(info.file)] = info
            elif m.shards and _index(info.file) < _index(m.shards[-1].file):  # finished out of order
                m.shards = sorted([*m.shards, info], key=lambda s: _index(s.file))
                m.sample_ids = [sid for s in m.shards for sid in self._ids_by_file[s.file]]
            else:
                m.shards.append(info)
                m.sample_ids += ids
            m.complete = False
            m.recount()
            m.write(self.directory)
            self._done.update(ids)
            self._inflight_ids.difference_update(ids)
            self._last_info = info
        return info

    def finish(
        self,
        token_freq: torch.Tensor,
        vocabs: Mapping[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
        val_ids: Sequence[str] | None = None,
        provenance: Mapping[str, Any] | None = None,
    ) -> Manifest:
        """Flush, write token frequencies and draft vocabularies, record which samples are
        validation (``val_ids``, all in the dataset) and what ``provenance`` adds (a figure known
        only at the end: the run's seconds), mark complete, unlock."""
        if self._lock is None:
            raise StoreError(f"{self.directory}: writer is closed")
        self.flush()
        self._stop_thread()
        m = self.manifest
        if self._redo.ids:
            missing = sorted(self._redo.waiting())
            raise StoreError(
                f"{self.directory}: shards {sorted(self._redo.ids)} are being redone but samples "
                f"{missing[:5]} ({len(missing)} in all) were not captured again (add them first)"
            )
        if m.num_samples == 0:
            raise StoreError(f"{self.directory}: no samples were written; refusing to mark an empty dataset complete")
        if val_ids is not None:
            unknown = sorted(set(val_ids) - self._done)
            if unknown:
                raise StoreError(f"{self.directory}: val_ids not in the dataset: {unknown[:5]} ({len(unknown)} in all)")
            m.val_ids = sorted(str(v) for v in val_ids)
        m.provenance.update(canonical(dict(provenance or {}), "provenance"))
        small = 8 * int(token_freq.numel()) + sum(9 * int(t2d.numel()) for _, t2d in (vocabs or {}).values())
        with disk_full_as_error(self.directory, small + len(m.to_json())):  # the last, small files
            save_token_freq(self.directory / TOKEN_FREQ, token_freq)
            m.token_freq = TOKEN_FREQ
            for V, (d2t, t2d) in (vocabs or {}).items():
                save_vocab(self.directory / vocab_name(V), V, d2t, t2d)
                m.vocabs[str(int(V))] = vocab_name(V)
            m.complete = True
            m.write(self.directory)
        self._release_lock()
        return m

    def close(self) -> None:
        """Flush what is queued (it is valid work) and unlock, without marking complete."""
        if self._lock is None:
            return
        try:
            if self._error is None:
                self.flush()
            elif not self._error_reported:
                self._raise_writer_error()
        finally:
            if self._jobs is not None:
                self._jobs.join()
            self._stop_thread()
            self._release_lock()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _index(shard_file: str) -> int:
    m = SHARD_RE.match(shard_file)
    assert m is not None, shard_file  # only listed shards' names come here
    return int(m.group(1))
