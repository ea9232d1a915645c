"""Reading a dataset: lazy, memory-mapped, one sample at a time.

Only the shard offsets are read up front; a sample's rows of ``hidden`` are sliced out of
the memory-mapped shard when asked for, so opening a multi-TB dataset costs nothing and a
DataLoader worker touches only the samples it serves. A sample's tensors are views of the
mapped file (copy-on-write, private to the process: shard_file.map_shard), so the batch's
collate copies them once; a caller that changes one in place changes what that dataset object
reads there afterwards, never the file. The mappings are per process (remade
after fork/spawn), so the dataset can go straight into a multi-worker DataLoader.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch

from eagle3.store.layout import (
    ONLINE,
    STORED,
    IncompleteDatasetError,
    Manifest,
    ShardInfo,
    StoreError,
    dtype_from_name,
)
from eagle3.store.shard_file import inspect_shard, manifest_identity, map_shard
from eagle3.store.storage_format import StorageFormat, decode_teacher, teacher_valid
from eagle3.store.vocab_files import check_token_freq, check_vocab, load_tensors


def _stamp(path: Path) -> tuple[int, int, int]:
    """What tells a file changed: inode, size, mtime (ns)."""
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


class DamagedDatasetError(StoreError):
    """A complete dataset whose shard on disk is not the one its manifest lists. ``problem``
    says which and how; ``needs_hash``: whether the repair should hash every shard
    (``capture.verify=full``): the damage is not a wrong size or a missing file, which every
    check finds. ``repair``: the exact command, where the caller knows it."""

    def __init__(self, directory: Path, problem: str, needs_hash: bool, repair: str | None = None):
        hint = (
            f"repair it with: {repair}"
            if repair
            else "re-run extract.py with the same overrides"
            f"{' and capture.verify=full' if needs_hash else ''} to repair the dataset"
        )
        super().__init__(f"{problem}; {hint}")
        self.directory, self.problem, self.needs_hash = Path(directory), problem, needs_hash


class SampleFiles:
    """Samples concatenated in the files a complete manifest lists, read lazily: the index
    (file, start, length per sample) comes from each file's offsets; the manifest's views
    (split, vocabularies, token counts) are shared by both kinds of dataset."""

    kind = ""  # Manifest.hidden_states this class reads

    def __init__(self, directory: str | Path, verify: str | None = None):
        self.directory = Path(directory)
        self.manifest = Manifest.read(self.directory)
        m = self.manifest
        if not m.complete:
            raise IncompleteDatasetError(
                f"{self.directory}: incomplete dataset ({m.num_samples} samples in {len(m.shards)} shards "
                "so far, complete=false): re-run extract.py with the same config to finish it"
            )
        if m.hidden_states != self.kind:
            raise StoreError(
                f"{self.directory / 'manifest.json'}: hidden_states: expected {self.kind!r}, got "
                f"{m.hidden_states!r}: {_HOW_TO_TRAIN.get(m.hidden_states, 'not an eagle3 dataset')}"
            )
        self.layer_ids: tuple[int, ...] = tuple(m.layer_ids)
        self.hidden_size: int = m.hidden_size
        self.dtype: torch.dtype = dtype_from_name(m.dtype)  # what a sample's hidden comes back in
        # how the shards hold it (eagle3/store/storage_format.py); with teacher_topk, the teacher's
        # top-k in place of the final layer (eagle3/store/teacher_topk.py)
        self.storage: StorageFormat = m.storage
        self.fingerprint: str = m.fingerprint
        shard_of, start_of, lengths = [], [], []
        for k, info in enumerate(m.shards):
            self._check_file(self.directory / info.file, info, verify)
            try:
                offsets = self._mapped(k)["offsets"]
            except Exception as e:  # a header overwritten in place: unparsable, or tensors past the file's end
                raise DamagedDatasetError(
                    self.directory,
                    f"{self.directory / info.file}: unreadable safetensors file ({type(e).__name__}: {e})",
                    needs_hash=True,
                ) from None
            if offsets.shape[0] != info.num_samples + 1:
                raise StoreError(
                    f"{self.directory / info.file}: offsets: expected {info.num_samples + 1} entries, "
                    f"got {offsets.shape[0]}"
                )
            shard_of += [k] * info.num_samples
            start_of += offsets[:-1].tolist()
            lengths += (offsets[1:] - offsets[:-1]).tolist()
        if len(lengths) != m.num_samples or len(m.sample_ids) != m.num_samples:
            raise StoreError(
                f"{self.directory / 'manifest.json'}: num_samples {m.num_samples} disagrees "
                f"with shards ({len(lengths)}) / sample_ids ({len(m.sample_ids)})"
            )
        self._shard_of = torch.tensor(shard_of, dtype=torch.int64)
        self._start = torch.tensor(start_of, dtype=torch.int64)
        self.lengths = torch.tensor(lengths, dtype=torch.int64)  # tokens per sample, for batching

    def _check_file(self, path: Path, info: ShardInfo, verify: str | None) -> None:
        """The cheap check every open makes: the file is there at its listed size."""
        if not path.is_file() or path.stat().st_size != info.size_bytes:
            got = f"{path.stat().st_size} bytes" if path.is_file() else "no such file"
            raise DamagedDatasetError(
                self.directory, f"{path}: size: expected {info.size_bytes} bytes, got {got}", needs_hash=False
            )

    # mappings are not picklable and not fork-safe: keep them per process, each with the file's
    # stamp when it was mapped (inode, size, mtime)
    _maps: dict[int, dict[str, torch.Tensor]] | None = None
    _stamps: dict[int, tuple[int, int, int]] | None = None
    _pid: int | None = None

    def _mapped(self, k: int) -> dict[str, torch.Tensor]:
        """Shard k's tensors as views of the file mapped in memory (shard_file.map_shard): a
        sample's rows are views, copied once, by the batch's collate. Each use checks the file
        is still the one mapped (``_check_unchanged``)."""
        if self._pid != os.getpid() or self._maps is None or self._stamps is None:
            self._maps, self._stamps, self._pid = {}, {}, os.getpid()
        path = self.directory / self.manifest.shards[k].file
        views = self._maps.get(k)
        if views is None:
            stamp = _stamp(path)
            views = self._maps[k] = map_shard(path)
            self._stamps[k] = stamp
        else:
            self._check_unchanged(path, self._stamps[k])
        return views

    def _check_unchanged(self, path: Path, mapped: tuple[int, int, int]) -> None:
        """Refuse a shard changed on disk since it was mapped (cut short, rewritten in place or
        replaced: a copy over a shared dataset during training), before its mapping is read: a
        page past a file's new end reads as SIGBUS, which names nothing. A stat per sample: a
        few microseconds beside the sample's copy."""
        try:
            now: tuple[int, int, int] | None = _stamp(path)
        except OSError:
            now = None
        if now == mapped:
            return
        got = "gone" if now is None else f"inode {now[0]}, {now[1]} bytes, mtime {now[2]} ns"
        raise DamagedDatasetError(
            self.directory,
            f"{path}: changed on disk while this process read it (mapped: inode {mapped[0]}, {mapped[1]} bytes, "
            f"mtime {mapped[2]} ns; now: {got}): a dataset must not be copied over or rewritten while a run "
            "reads it",
            needs_hash=True,
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_maps", None)
        state.pop("_stamps", None)
        state.pop("_pid", None)
        return state

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def _rows(self, i: int, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"{self.directory}: sample index {i} out of range 0..{n - 1}")
        i %= n
        views = self._mapped(int(self._shard_of[i]))
        a = int(self._start[i])
        b = a + int(self.lengths[i])
        return {name: views[name][a:b] for name in names}

    def sample_id(self, i: int) -> str:
        return self.manifest.sample_ids[i]

    def tokens(self, i: int) -> dict[str, torch.Tensor]:
        """Sample i's input_ids and loss_mask only (no hidden states read)."""
        return self._rows(i, ("input_ids", "loss_mask"))

    @property
    def sample_ids(self) -> list[str]:
        return list(self.manifest.sample_ids)

    def val_indices(self) -> list[int]:
        """Indices of the validation samples (the split made at extraction)."""
        val = set(self.manifest.val_ids)
        return [i for i, sid in enumerate(self.manifest.sample_ids) if sid in val]

    @property
    def num_tokens(self) -> int:
        return self.manifest.num_tokens

    def token_freq(self) -> torch.Tensor:
        """int64 [target vocab]: counts of loss-masked (assistant) tokens."""
        if not self.manifest.token_freq:
            raise StoreError(f"{self.directory}: no token_freq recorded; re-run extract.py")
        t = load_tensors(self.directory / self.manifest.token_freq, ("token_freq",))["token_freq"]
        return check_token_freq(t)

    @property
    def vocab_sizes(self) -> list[int]:
        return sorted(int(v) for v in self.manifest.vocabs)

    def load_vocab(self, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(d2t int64 [V], t2d bool [target vocab]) for draft vocabulary size V."""
        name = self.manifest.vocabs.get(str(int(draft_vocab_size)))
        if name is None:
            raise StoreError(
                f"{self.directory}: no draft vocabulary of size {draft_vocab_size}; have {self.vocab_sizes} "
                "(build one from token_freq() and add it with eagle3.store.add_vocab)"
            )
        t = load_tensors(self.directory / name, ("d2t", "t2d"))
        return check_vocab(draft_vocab_size, t["d2t"], t["t2d"])


_HOW_TO_TRAIN = {
    STORED: "a dataset of stored hidden states: train it with train.hidden_states=offline",
    ONLINE: "token ids only, the target computes the hidden states: train it with train.hidden_states=online",
}


class HiddenStateDataset(SampleFiles):
    """A complete dataset directory written by ``ShardWriter``.

    ``ds[i]`` -> dict(input_ids int64 [T], loss_mask bool [T], hidden [T, L, H]): hidden in
    the manifest's dtype whatever the storage format (an fp8 shard's rows are decoded here, in
    the loader's workers). ``encoded_rows()``: a view of the same dataset whose samples keep the
    format's own tensors (decoded where the training runs: eagle3/training/datamodule.py).
    A dataset with the teacher's top-k (``teacher_topk``) has no final layer: in place of
    ``hidden`` its samples hold ``aux_layers`` [T, L-1, H] (the manifest's dtype), ``teacher_ids``
    int64 [T, k] and ``teacher_logprobs`` float32 [T, k].
    """

    kind = STORED
    decode_rows = True  # False: samples keep the storage format's tensors (encoded_rows)
    _vocab: int | None = None  # the target's vocabulary, read once (a top-k dataset's id bound)

    def _check_file(self, path: Path, info: ShardInfo, verify: str | None) -> None:
        if verify is None:
            return super()._check_file(path, info, verify)
        try:
            inspect_shard(path, manifest_identity(self.manifest), info, verify)
        except StoreError as e:
            raise DamagedDatasetError(self.directory, str(e), needs_hash=verify == "full") from None

    def encoded_rows(self) -> "HiddenStateDataset":
        """This dataset, its samples as stored: dict(input_ids, loss_mask, and the tensors of
        ``storage.tensor_names()``, each [T, ...]), checked to decode to finite values
        without decoding them; an exact dataset's samples are the same either way."""
        view = copy.copy(self)
        view.decode_rows = False
        return view

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        names = self.storage.tensor_names()
        rows = self._rows(i, ("input_ids", "loss_mask", *names))
        if self.storage.is_exact:
            self._check_finite(i, rows["hidden"])
            return rows
        stored = {name: rows.pop(name) for name in names}
        if self.storage.teacher_topk is not None:
            return rows | self._teacher_sample(i, stored)
        # judged on the codes and scales (a NaN code too, which the CPU's bits path would decode to
        # a number); a possible non-finite value is located in the float path's decode, as the
        # device computes it (a bound that was only conservative passes)
        if not self.storage.decodes_finite(stored, self.dtype):
            self._check_finite(i, self.storage.decode(stored, self.dtype, float_path=True))
        if not self.decode_rows:
            return rows | stored
        return rows | {"hidden": self.storage.decode(stored, self.dtype)}

    def _teacher_sample(self, i: int, stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A top-k sample's stored tensors (``encoded_rows``) or their decoded values, checked."""
        if not self.storage.decodes_finite(stored, self.dtype, self._vocab_size()):
            if not teacher_valid(stored, self._vocab_size()):
                i %= len(self)
                shard = self.directory / self.manifest.shards[int(self._shard_of[i])].file
                raise DamagedDatasetError(
                    self.directory,
                    f"{shard}: sample {self.sample_id(i)!r}: teacher_logprobs / teacher_ids: expected finite "
                    f"log-probabilities and ids in 0..{self._vocab_size() - 1}, got a value outside",
                    needs_hash=True,
                )
            self._check_finite(i, self.storage.decode_aux(stored, self.dtype))
        if not self.decode_rows:
            return stored
        ids, logprobs = decode_teacher(stored)  # [T, k] int64, [T, k] float32
        aux = self.storage.decode_aux(stored, self.dtype)  # [T, L-1, H]
        return {"aux_layers": aux, "teacher_ids": ids, "teacher_logprobs": logprobs}

    def _vocab_size(self) -> int:
        """The target's vocabulary (token_freq's length): the bound of a stored teacher id."""
        if self._vocab is None:
            self._vocab = int(self.token_freq().numel())
        return self._vocab

    def _check_finite(self, i: int, hidden: torch.Tensor) -> None:
        """Refuse a sample whose stored hidden states hold a NaN or an Inf (one pass over its
        rows, as they are read): trained on, it turns the head's weights, and then its
        checkpoints and export, into NaN. The capture adapter refuses them when they are made;
        this finds them in a dataset written before that check, or damaged since."""
        if hidden.numel() == 0:
            return
        # the extremes first: a NaN propagates into them and an Inf is one, in a pass that builds no
        # [T, L, H] mask (35x faster on a CPU at width 7,168, where the mask made the loader slower
        # than a training step); only a bad sample pays for the mask that locates the value
        lo, hi = torch.aminmax(hidden)
        if bool(torch.isfinite(lo)) and bool(torch.isfinite(hi)):
            return
        finite = torch.isfinite(hidden)
        bad = (~finite).nonzero()
        t, layer, h = (int(x) for x in bad[0])
        i %= len(self)
        shard = self.directory / self.manifest.shards[int(self._shard_of[i])].file
        layer_id = self.layer_ids[layer] if layer < len(self.layer_ids) else layer
        raise DamagedDatasetError(
            self.directory,
            f"{shard}: sample {self.sample_id(i)!r}: hidden: expected finite values, got {bad.shape[0]} "
            f"non-finite of {hidden.numel()} (the first, {float(hidden[t, layer, h])}, at token {t}, "
            f"layer id {layer_id}, channel {h})",
            needs_hash=True,
        )


def damaged_shards(directory: str | Path, manifest: Manifest, verify: str = "fast") -> list[tuple[str, str]]:
    """(file, what is wrong) for each listed shard that is missing, short, unreadable or
    (``verify="full"``) whose bytes do not hash to the manifest's sha256; [] when all are whole."""
    directory = Path(directory)
    ident = manifest_identity(manifest)
    bad = []
    for info in manifest.shards:
        try:
            inspect_shard(directory / info.file, ident, info, verify)
        except StoreError as e:
            bad.append((info.file, str(e)))
    return bad


def shards_on_disk(directory: str | Path) -> bool:
    """Whether a complete dataset's shard files are here (a manifest copied from another
    machine has none); sizes and checksums are HiddenStateDataset's to check."""
    directory = Path(directory)
    try:
        m = Manifest.read(directory)
    except (OSError, StoreError):
        return False
    return bool(m.complete and m.shards) and all((directory / info.file).is_file() for info in m.shards)
