"""Stream JSON records out of a file, without loading it whole.

Accepts the two layouts chat data comes in, told apart by the file's first non-blank character:

- ``[``: one top-level JSON array of records (ShareGPT's ``[{...}, {...}, ...]``). Records are
  decoded one at a time with ``json.JSONDecoder.raw_decode`` over a growing text buffer (no new
  dependency; the C scanner does the work). A file that *ends* inside a record or before the
  closing ``]`` -- the packaged ShareGPT file is cut off at 125 MB -- stops after the last whole
  record and records where and why: ``cut_off`` is True, ``stop_reason`` says "cut off". Invalid
  JSON anywhere before the end (a broken record, a missing comma, text after the ``]``) is not a
  cut: it raises `DataError` naming the file, the byte offset and the line. More text is read
  only while the record being decoded may still be complete further on (the error sits at the
  end of the text read so far), never the rest of the file to decide.
- anything else: JSONL, one record per line (blank lines ignored). A line that is not valid
  JSON is skipped and counted with its line number and column (``bad_lines``, the first few in
  ``first_bad``); a last line cut short is such a line. A line holding invalid UTF-8 is read with
  U+FFFD in place of the bad bytes and counted with its line and byte column (``utf8_lines``).
  When more than ``max_bad_fraction`` (data.max_bad_fraction, default 1%) of the non-blank lines
  are bad, the reading fails: `DataError` naming the file, the counts and the first bad lines
  (`StreamEnd.check_lines` judges the lines read so far the same way, for a reader that stopped
  early); a few are skipped with a warning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from eagle3.data.conversation import DataError

_WHITESPACE = " \t\n\r"
# A decode error this close to the end of the text read is the text ending, not bad JSON
# (a cut inside `true` or `1.5e` reports the error at the literal's start).
_CUT_SLACK_CHARS = 16
SHOWN_BAD_LINES = 5  # line numbers named in warnings and errors
# the share of a JSONL file's lines that may be bad (skipped, with a warning) before the reading
# fails (data.max_bad_fraction): a few broken lines in a large export are skipped, a file of
# another format or a damaged one is refused
DEFAULT_MAX_BAD_FRACTION = 0.01


@dataclass
class StreamEnd:
    complete: bool = False  # the file ended cleanly (closed array / end of a JSONL file)
    cut_off: bool = False  # a JSON array file that ends inside a record or before its ']'
    stop_reason: str | None = None
    stop_offset_bytes: int | None = None  # where the unreadable tail starts
    jsonl: bool = False  # one record per line
    lines: int = 0  # JSONL: non-blank lines read
    line_no: int = 0  # JSONL: the line of the record last handed on
    bad_lines: int = 0  # JSONL: of those, lines that are not valid JSON (skipped)
    first_bad: list[tuple[int, str]] = field(default_factory=list)  # (line number, JSON error), the first few
    utf8_lines: int = 0  # JSONL: lines (valid JSON) holding invalid UTF-8, read with U+FFFD in its place
    first_utf8: list[tuple[int, int]] = field(default_factory=list)  # (line number, byte column), the first few
    max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION

    def too_many_bad(self) -> bool:
        """More than max_bad_fraction of the non-blank lines read are bad: fail, do not skip."""
        return self.bad_lines + self.utf8_lines > self.max_bad_fraction * self.lines

    def bad_lines_text(self) -> str:
        parts = []
        if self.bad_lines:
            shown = ", ".join(f"line {n} ({why})" for n, why in self.first_bad)
            more = f" and {self.bad_lines - len(self.first_bad)} more" if self.bad_lines > len(self.first_bad) else ""
            parts.append(f"{self.bad_lines} of {self.lines} non-blank lines are not valid JSON: {shown}{more}")
        if self.utf8_lines:
            shown = ", ".join(f"line {n} (byte column {c})" for n, c in self.first_utf8)
            more = (
                f" and {self.utf8_lines - len(self.first_utf8)} more" if self.utf8_lines > len(self.first_utf8) else ""
            )
            parts.append(
                f"{self.utf8_lines} of {self.lines} non-blank lines hold invalid UTF-8 (read with U+FFFD in its "
                f"place): {shown}{more}"
            )
        return "; ".join(parts)

    def check_lines(self, path: str | Path) -> str | None:
        """None when every line read was good; the warning to give when a few were not; raises
        DataError when more than max_bad_fraction of them were not."""
        if not self.bad_lines and not self.utf8_lines:
            return None
        if self.too_many_bad():
            raise DataError(
                f"{path}: {self.bad_lines_text()}; expected at most {self.max_bad_fraction:.0%} bad lines "
                f"(data.max_bad_fraction={self.max_bad_fraction}), got {self.bad_lines + self.utf8_lines} of "
                f"{self.lines}: fix those lines (a JSONL file holds one JSON object per line, in UTF-8), or pass "
                "data.max_bad_fraction=<a larger share> to skip them"
            )
        return f"{path}: skipped {self.bad_lines_text()}" if self.bad_lines else f"{path}: {self.bad_lines_text()}"


# a record deeper than the decoder's recursion limit (about a thousand levels; no chat record nests so)
NESTED_TOO_DEEPLY = "a record nested too deeply to decode (Python's recursion limit)"


class JsonRecordStream:
    """Iterate over the top-level records of ``path``; read ``.end`` afterwards."""

    def __init__(
        self, path: str | Path, chunk_chars: int = 1 << 20, max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION
    ) -> None:
        self.path = Path(path)
        self.chunk_chars = chunk_chars
        self.end = StreamEnd(max_bad_fraction=max_bad_fraction)
        self._decoder = json.JSONDecoder()

    def __iter__(self) -> Iterator[Any]:
        # utf-8-sig: a leading BOM is not a record. errors="replace": a multi-byte
        # character split by the cut must not abort the records before it.
        with open(self.path, encoding="utf-8-sig", errors="replace") as fh:
            first = _first_char(fh)
            fh.seek(0)
            if first is None:
                self.end.complete = True  # an empty file: complete, and empty
                return
            if first == "[":
                yield from _Reader(self.path, fh, self.chunk_chars, self._decoder, self.end).array_records()
                return
        yield from self._jsonl_records()

    def _jsonl_records(self) -> Iterator[Any]:
        end = self.end
        end.jsonl = True
        with open(self.path, "rb") as fh:  # bytes: a line's invalid UTF-8 is found, and counted, per line
            for line_no, raw in enumerate(fh, 1):
                line, bad_byte = _decode_line(raw[3:] if line_no == 1 and raw.startswith(b"\xef\xbb\xbf") else raw)
                if not line.strip():
                    continue
                end.lines += 1
                line = line.rstrip("\r\n")  # an error at the line's end is at its real column, not line 2's first
                try:
                    value = self._decoder.decode(line)
                except RecursionError:  # a bad record too: skipped and counted, not the end of the read
                    end.bad_lines += 1
                    if len(end.first_bad) < SHOWN_BAD_LINES:
                        end.first_bad.append((line_no, NESTED_TOO_DEEPLY))
                    continue
                except json.JSONDecodeError as err:
                    end.bad_lines += 1
                    if len(end.first_bad) < SHOWN_BAD_LINES:
                        cut = err.pos >= len(line.rstrip()) or err.msg.startswith("Unterminated")
                        what = err.msg.removesuffix(" at")  # "Unterminated string starting at"
                        end.first_bad.append(
                            (
                                line_no,
                                f"{what} at column {err.colno}" + (" (the line ends inside the record)" if cut else ""),
                            )
                        )
                    continue
                if bad_byte is not None:
                    end.utf8_lines += 1
                    if len(end.first_utf8) < SHOWN_BAD_LINES:
                        end.first_utf8.append((line_no, bad_byte))
                end.line_no = line_no
                yield value
        end.check_lines(self.path)  # raises when too many lines are bad
        end.complete = True


def _decode_line(raw: bytes) -> tuple[str, int | None]:
    """The line as text and the 1-based byte column of its first invalid UTF-8 (None: valid)."""
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as err:
        return raw.decode("utf-8", errors="replace"), err.start + 1


def _first_char(fh) -> str | None:
    """The first non-whitespace character (None: an empty file), read a little at a time."""
    while text := fh.read(4096):
        stripped = text.lstrip(_WHITESPACE)
        if stripped:
            return stripped[0]
    return None


class _Reader:
    def __init__(self, path: Path, fh, chunk_chars: int, decoder: json.JSONDecoder, end: StreamEnd) -> None:
        self.path = path
        self.fh = fh
        self.chunk_chars = chunk_chars
        self.decoder = decoder
        self.end = end
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.dropped_bytes = 0  # bytes of text already consumed and dropped from buf
        self.dropped_lines = 0  # newlines in that text

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
            done = self.buf[: self.pos]
            self.dropped_bytes += len(done.encode("utf-8"))
            self.dropped_lines += done.count("\n")
            self.buf = self.buf[self.pos :]
            self.pos = 0
        self.buf += text
        return True

    def skip_whitespace(self) -> bool:
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

    def _where(self, pos: int) -> str:
        line = self.dropped_lines + self.buf.count("\n", 0, pos) + 1
        return f"byte {self._offset_bytes(pos)} (line {line})"

    def _cut(self, reason: str, pos: int) -> None:
        self.end.cut_off = True
        self.end.stop_reason = reason
        self.end.stop_offset_bytes = self._offset_bytes(pos)

    def _invalid(self, what: str, pos: int) -> DataError:
        return DataError(
            f"{self.path}: invalid JSON at {self._where(pos)}: {what}; only a file that ends inside its "
            "last record is read as cut off, an error before the end is not skipped -- fix the file"
        )

    def _decode_one(self) -> tuple[bool, Any]:
        """Decode the record at pos, reading more text only while it may be incomplete."""
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise self._invalid(NESTED_TOO_DEEPLY, self.pos) from None
            except json.JSONDecodeError as err:
                tail = len(self.buf.rstrip(_WHITESPACE))
                at_end = err.msg.startswith("Unterminated string") or err.pos >= tail - _CUT_SLACK_CHARS
                if not at_end:
                    raise self._invalid(err.msg, err.pos) from None
                if self._read_more():
                    continue
                self._cut("file ends inside a record (cut off)", self.pos)
                return False, None
            # a bare number at the buffer's end may continue in the next chunk
            if end == len(self.buf) and not isinstance(value, (dict, list)) and self._read_more():
                continue
            self.pos = end
            return True, value

    def array_records(self) -> Iterator[Any]:
        self.skip_whitespace()
        self.pos += 1  # the '['
        while True:
            if not self.skip_whitespace():
                self._cut("file ends inside the top-level array (cut off)", self.pos)
                return
            if self.buf[self.pos] == "]":
                self.pos += 1
                if self.skip_whitespace():
                    raise self._invalid("unexpected text after the closing ']'", self.pos)
                self.end.complete = True
                return
            ok, value = self._decode_one()
            if not ok:
                return
            yield value
            if not self.skip_whitespace():
                self._cut("file ends inside the top-level array (cut off)", self.pos)
                return
            sep = self.buf[self.pos]
            if sep == ",":
                self.pos += 1
            elif sep != "]":
                raise self._invalid(f"expected ',' or ']' after a record, got {sep!r}", self.pos)
