"""``data.source=hf``: chat data through ``datasets.load_dataset``, from the Hub
(``data.hf_name``, ``data.hf_config``, ``data.hf_split``, ``data.hf_revision``) or from local
parquet / JSON / JSONL / CSV files (``data.path``: one file, or a directory of files of one kind).

Each row becomes the record shape `normalise_record` reads, ``{"id", "messages"}``, from either

- a conversation column (``data.messages_column``; null: ``messages`` or ``conversations``),
  a list of turns whose role and text sit under ``data.role_key`` / ``data.content_key``
  (null: ``role`` or ``from``, ``content`` or ``value``: OpenAI and ShareGPT turns), or
- single-turn columns ``data.prompt_column`` + ``data.response_column`` (a user turn, its answer).

A row that does not have the declared shape is an error naming the dataset, the record index,
the field, what was expected and what was there. A well-formed conversation that breaks the
chat rules (an empty turn, no answer) is skipped and counted as from every other source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, cast

from eagle3.data.conversation import DataError

# the data.* fields only this source reads: out of the fingerprint of the other sources
HF_FIELDS = (
    "hf_name",
    "hf_config",
    "hf_revision",
    "hf_split",
    "messages_column",
    "role_key",
    "content_key",
    "prompt_column",
    "response_column",
)
_BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv"}
_CONVERSATION_COLUMNS = ("messages", "conversations")


@dataclass(frozen=True)
class HFOptions:
    name: str | None = None
    config: str | None = None
    revision: str | None = None
    split: str = "train"
    messages_column: str | None = None
    role_key: str | None = None
    content_key: str | None = None
    prompt_column: str | None = None
    response_column: str | None = None

    @classmethod
    def from_data(cls, data: Any) -> "HFOptions":
        """From ``cfg.data`` or the data dict a manifest recorded (absent fields: defaults)."""

        def get(key: str, default: Any = None) -> Any:
            value = data.get(key, default)
            return default if value is None else value

        return cls(
            name=get("hf_name"),
            config=get("hf_config"),
            revision=get("hf_revision"),
            split=str(get("hf_split", "train")),
            messages_column=get("messages_column"),
            role_key=get("role_key"),
            content_key=get("content_key"),
            prompt_column=get("prompt_column"),
            response_column=get("response_column"),
        )

    def label(self, path: Path | None) -> str:
        """How errors name the dataset."""
        return f"data.path={path}" if path is not None else f"data.hf_name={self.name} (split {self.split})"

    def id_stem(self, path: Path | None) -> str:
        """What ids of rows without an ``id`` column start with (as the file stem for JSONL)."""
        return path.stem if path is not None else str(self.name)


def local_data_files(path: Path) -> tuple[str, list[Path]]:
    """(load_dataset builder, files) of a local file or a directory of files of one kind."""
    files = (
        [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    )
    kinds = {_BUILDERS.get(p.suffix.lower()) for p in files}
    if not files or None in kinds or len(kinds) != 1:
        got = sorted({p.suffix or p.name for p in files}) or "no files"
        raise DataError(
            f"data.path={path} (data.source=hf): expected parquet, JSON, JSONL or CSV files of one kind "
            f"({', '.join(_BUILDERS)}), got {got}"
        )
    builder = kinds.pop()
    assert builder is not None  # a file of no known kind raised above
    return builder, files


def load_hf_dataset(opts: HFOptions, path: Path | None):
    """The ``datasets.Dataset`` of one split: ``data.path``'s files, else ``data.hf_name``."""
    import datasets

    if (opts.name is None) == (path is None):
        raise DataError(
            f"data.source=hf: expected exactly one of data.hf_name (a hub dataset) or data.path (local "
            f"parquet/JSON/JSONL/CSV), got hf_name={opts.name!r}, path={None if path is None else str(path)!r}"
        )
    try:
        if path is not None:
            builder, files = local_data_files(path)
            return datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train")
        return datasets.load_dataset(opts.name, opts.config, split=opts.split, revision=opts.revision)
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - datasets raises many kinds; each is named here
        raise DataError(f"{opts.label(path)}: datasets.load_dataset failed ({type(err).__name__}: {err})") from err


def _columns(ds: Any, opts: HFOptions, label: str) -> tuple[str | None, tuple[str, str] | None]:
    """(conversation column, None) or (None, (prompt column, response column)), checked."""
    columns = list(ds.column_names)
    if opts.prompt_column or opts.response_column:
        for key, col in (("prompt_column", opts.prompt_column), ("response_column", opts.response_column)):
            if col not in columns:
                raise DataError(f"{label}: data.{key}: expected one of the columns {columns}, got {col!r}")
        # both checked above to be column names (None is not one)
        return None, cast(tuple[str, str], (opts.prompt_column, opts.response_column))
    wanted = [opts.messages_column] if opts.messages_column else list(_CONVERSATION_COLUMNS)
    found = next((c for c in wanted if c in columns), None)
    if found is None:
        raise DataError(
            f"{label}: expected a conversation column ({' or '.join(wanted)}; set data.messages_column) "
            f"or data.prompt_column + data.response_column, got columns {columns}"
        )
    return found, None


def _pick(turn: dict, key: str | None, defaults: tuple[str, str]) -> tuple[str, Any]:
    """(field name, value) of a turn: ``key`` when set, else the first default that has a value."""
    if key:
        return key, turn.get(key)
    for name in defaults:
        if turn.get(name) is not None:
            return name, turn[name]
    return defaults[0], None


def _turns(value: Any, where: str, opts: HFOptions) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise DataError(f"{where}: expected a list of turns, got {type(value).__name__} {value!r:.80}")
    out = []
    for j, turn in enumerate(value):
        if not isinstance(turn, dict):
            raise DataError(
                f"{where}[{j}]: expected a mapping with a role and a content, got {type(turn).__name__} {turn!r:.80}"
            )
        role_field, role = _pick(turn, opts.role_key, ("role", "from"))
        content_field, content = _pick(turn, opts.content_key, ("content", "value"))
        for field, got, what in ((role_field, role, "a role name"), (content_field, content, "the turn's text")):
            if not isinstance(got, str):
                raise DataError(
                    f"{where}[{j}].{field}: expected a string ({what}; keys there: {sorted(turn)}), "
                    f"got {type(got).__name__} {got!r:.80}"
                )
        out.append({"role": role, "content": content})
    return out


def hf_records(opts: HFOptions, path: Path | None) -> Iterator[dict[str, Any]]:
    """The dataset's rows as ``{"id", "messages"}`` records, in order."""
    ds = load_hf_dataset(opts, path)
    label = opts.label(path)
    conversation, pair = _columns(ds, opts, label)
    for index, row in enumerate(ds):
        where = f"{label}: record {index}"
        if pair is not None:
            for col in pair:
                if not isinstance(row[col], str):
                    raise DataError(
                        f"{where}: {col}: expected a string, got {type(row[col]).__name__} {row[col]!r:.80}"
                    )
            messages = [{"role": "user", "content": row[pair[0]]}, {"role": "assistant", "content": row[pair[1]]}]
        else:
            messages = _turns(row[conversation], f"{where}: {conversation}", opts)
        yield {"id": row.get("id"), "messages": messages}
