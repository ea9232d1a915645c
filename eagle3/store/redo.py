"""Shards redone in place: a listed shard found missing, short or corrupt keeps its file name
and its slot in the manifest; its samples, captured again, are collected here until all of
them are back, then written as that shard again, in their old order."""

from __future__ import annotations

from typing import Any


class RedoSlots:
    def __init__(self) -> None:
        self.ids: dict[str, list[str]] = {}  # shard file -> its sample ids, in shard order
        self._file_of: dict[str, str] = {}  # sample id -> the shard it goes back to
        self._got: dict[str, dict[str, Any]] = {}  # shard file -> its samples captured again so far

    def add(self, file: str, sample_ids: list[str]) -> None:
        self.ids[file] = list(sample_ids)
        self._file_of.update((sid, file) for sid in sample_ids)

    def waiting(self) -> set[str]:
        """Sample ids still to be captured again."""
        return set(self._file_of)

    def owns(self, sid: str) -> bool:
        return sid in self._file_of

    def has(self, sid: str) -> bool:
        """Whether ``sid`` was already given back (a duplicate)."""
        file = self._file_of.get(sid)
        return file is not None and sid in self._got.get(file, {})

    def give(self, sid: str, sample: Any) -> tuple[str, list[str], list[Any]] | None:
        """Take one sample back; (file, ids, samples) once its shard has all of them."""
        file = self._file_of[sid]
        got = self._got.setdefault(file, {})
        got[sid] = sample
        ids = self.ids[file]
        if len(got) < len(ids):
            return None
        del self.ids[file], self._got[file]
        for i in ids:
            del self._file_of[i]
        return file, ids, [got[i] for i in ids]
