"""Stream JSON records out of a file that may be cut off, without loading it whole.

Accepts the two layouts chat data comes in:

- one top-level JSON array of records (ShareGPT's ``[{...}, {...}, ...]``);
- records one after another, separated by whitespace (JSONL, one per line).

Records are decoded one at a time with ``json.JSONDecoder.raw_decode`` over a growing
text buffer (no new dependency; the C scanner does the work). When the file ends in the
middle of a record -- the packaged ShareGPT file is cut off at 125 MB -- the stream stops
after the last whole record and records *where* and *why* it stopped, instead of failing:
``cut_off`` is True and ``stop_reason`` says "file ends inside a record" (a cut) or names
the JSON syntax error and its offset (a file broken in the middle, which we cannot
re-synchronise on either).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

_WHITESPACE = " \t\n\r"
# A decode error this close to the end of the file is the file ending, not bad JSON
# (a cut inside `true` or `1.5e` reports the error at the literal's start).
_CUT_SLACK_CHARS = 16


@dataclass
class StreamEnd:
    complete: bool = False  # the file ended cleanly (closed array / last JSONL record)
    cut_off: bool = False  # stopped early: file ends inside a record, or broken JSON
    stop_reason: str | None = None
    stop_offset_bytes: int | None = None  # where the unreadable tail starts


class JsonRecordStream:
    """Iterate over the top-level records of ``path``; read ``.end`` afterwards."""

    def __init__(self, path: str | Path, chunk_chars: int = 1 << 20) -> None:
        self.path = Path(path)
        self.chunk_chars = chunk_chars
        self.end = StreamEnd()
        self._decoder = json.JSONDecoder()

    def __iter__(self) -> Iterator[Any]:
        # utf-8-sig: a leading BOM is not a record. errors="replace": a multi-byte
        # character split by the cut must not abort the records before it.
        with open(self.path, encoding="utf-8-sig", errors="replace") as fh:
            yield from _Reader(fh, self.chunk_chars, self._decoder, self.end).records()


class _Reader:
    def __init__(self, fh, chunk_chars: int, decoder: json.JSONDecoder, end: StreamEnd) -> None:
        self.fh = fh
        self.chunk_chars = chunk_chars
        self.decoder = decoder
        self.end = end
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.dropped_bytes = 0  # bytes of text already consumed and dropped from buf

    def _read_more(self) -> bool:
        """Append at least a chunk (and at least the unread part again, so one record
        larger than the buffer costs O(n log n) re-parsing, not O(n^2))."""
        if self.eof:
            return False
        want = max(self.chunk_chars, len(self.buf) - self.pos)
        text = self.fh.read(want)
        if not text:
            self.eof = True
            return False
        if self.pos > self.chunk_chars:  # drop what is consumed before growing
            self.dropped_bytes += len(self.buf[: self.pos].encode("utf-8"))
            self.buf = self.buf[self.pos :]
            self.pos = 0
        self.buf += text
        return True

    def _skip_whitespace(self) -> bool:
        """Move past whitespace; False when the file holds nothing more."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WHITESPACE:
                self.pos += 1
            if self.pos < len(self.buf):
                return True
            if not self._read_more():
                return False

    def _offset_bytes(self, pos: int) -> int:
        return self.dropped_bytes + len(self.buf[:pos].encode("utf-8"))

    def _stop(self, reason: str, pos: int) -> None:
        self.end.cut_off = True
        self.end.stop_reason = reason
        self.end.stop_offset_bytes = self._offset_bytes(pos)

    def _decode_one(self) -> tuple[bool, Any]:
        """Decode the record at pos, reading more text while it is incomplete."""
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                if self._read_more():
                    continue
                tail = len(self.buf.rstrip(_WHITESPACE))
                if err.msg.startswith("Unterminated string") or err.pos >= tail - _CUT_SLACK_CHARS:
                    self._stop("file ends inside a record (cut off)", self.pos)
                else:
                    where = self._offset_bytes(err.pos)
                    self._stop(f"invalid JSON at byte {where}: {err.msg}", self.pos)
                return False, None
            # a bare number at the buffer's end may continue in the next chunk
            if end == len(self.buf) and not isinstance(value, (dict, list)) and self._read_more():
                continue
            self.pos = end
            return True, value

    def records(self) -> Iterator[Any]:
        if not self._skip_whitespace():
            self.end.complete = True  # an empty file: complete, and empty
            return
        in_array = self.buf[self.pos] == "["
        if in_array:
            self.pos += 1
        while True:
            if not self._skip_whitespace():
                if in_array:
                    self._stop("file ends inside the top-level array (cut off)", self.pos)
                else:
                    self.end.complete = True
                return
            if in_array and self.buf[self.pos] == "]":
                self.pos += 1
                if self._skip_whitespace():
                    self._stop("unexpected text after the closing ']'", self.pos)
                else:
                    self.end.complete = True
                return
            ok, value = self._decode_one()
            if not ok:
                return
            yield value
            if in_array:
                if not self._skip_whitespace():
                    self._stop("file ends inside the top-level array (cut off)", self.pos)
                    return
                sep = self.buf[self.pos]
                if sep == ",":
                    self.pos += 1
                elif sep != "]":
                    self._stop(
                        f"invalid JSON at byte {self._offset_bytes(self.pos)}: "
                        f"expected ',' or ']' after a record, got {sep!r}",
                        self.pos,
                    )
                    return
