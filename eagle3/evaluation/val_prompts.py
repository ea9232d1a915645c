"""The validation split's prompts (in-distribution, labelled so beside the held-out sets).

The first user turn (after any leading system turn) of each conversation in the
dataset's validation split, in the split's order. The dataset stores token ids, not chat
messages, so the conversations are read again from the chat source recorded in the
manifest (``fingerprint_inputs["data"]``, the path in ``provenance["data_path"]``) and picked
by id (``manifest.val_ids``). Ids are positions in an id-less JSONL, so a file edited since
extraction would map them onto other conversations: each prompt is checked by content against
what the dataset stored, the tokens of its sample before the first answer token (render.py
tokenizes that served prompt as its own piece, so it equals ``render_prompt`` of the opening
turn token for token), and a mismatch is refused naming the file, the id, expected and got.
A dataset whose samples are not at hand (the manifest copied alone) is checked as a whole by
the chat file's content hash its fingerprint holds. A dataset of a ``data.mixture`` takes its
prompts from its samples instead (the tokens before the first answer token): some of its user
turns were written by the target and live in no chat file, and those tokens are the served prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Generator

from eagle3.data.conversation import DataError, conversation_of
from eagle3.data.hf_source import HFOptions
from eagle3.data.loaders import iter_conversations, resolve_path
from eagle3.store import Manifest, StoreError, open_dataset
from eagle3.store.reader import SampleFiles
from eagle3.util.hashing import file_sha256, tree_sha


class PromptError(RuntimeError):
    """The held-out prompts cannot be built (names the file/field, expected, got)."""


def first_user_turn(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Leading system turns + the first user turn: the opening request of the conversation."""
    out: list[dict[str, str]] = []
    for m in messages:
        out.append({"role": m["role"], "content": m["content"]})
        if m["role"] == "user":
            return out
    raise PromptError(f"conversation has no user turn (roles: {[m['role'] for m in messages]})")


def _data_path(manifest_file: Path, given: Any) -> str | None:
    if given is None:
        return None
    path = Path(str(given)).expanduser()
    if not path.is_absolute() and not path.exists():
        raise PromptError(
            f"{manifest_file}: the chat data's path {given!r} (relative) does not exist from "
            f"{Path.cwd()}; run from the directory extract.py ran in, or pass the validation prompts' "
            "dataset from there"
        )
    return str(path)


def is_mixture_dataset(dataset_dir: str | Path) -> bool:
    """Whether the dataset was extracted from a data.mixture."""
    data = (Manifest.read(Path(dataset_dir)).fingerprint_inputs or {}).get("data")
    return isinstance(data, dict) and bool(data.get("mixture"))


def stored_val_prompts(dataset_dir: str | Path) -> Generator[tuple[str, list[int]], None, None]:
    """(conversation id, served prompt of its opening turn) of the dataset's validation split, in
    the split's order, once per conversation, read from the dataset's own samples: the tokens of
    the conversation's first validation sample before its first answer token."""
    dataset_dir = Path(dataset_dir)
    manifest = Manifest.read(dataset_dir)
    try:
        samples = open_dataset(dataset_dir)
    except StoreError as err:
        raise PromptError(
            f"{dataset_dir / 'manifest.json'}: a data.mixture dataset's validation prompts are read from its "
            f"samples, which cannot be read: {err}"
        ) from err
    first = _first_val_samples(manifest)
    for conversation_id in dict.fromkeys(conversation_of(sid) for sid in manifest.val_ids):
        if conversation_id in first:
            yield conversation_id, _stored_prompt(samples, first[conversation_id])


def _first_val_samples(manifest: Manifest) -> dict[str, int]:
    """conversation id -> the index of its first validation sample."""
    first: dict[str, int] = {}
    val = set(manifest.val_ids)
    for i, sid in enumerate(manifest.sample_ids):
        if sid in val:
            first.setdefault(conversation_of(sid), i)
    return first


def _stored_prompt(samples: SampleFiles, i: int) -> list[int]:
    """Sample i's tokens before its first answer (loss-mask) token: the served prompt of its opening turn."""
    row = samples.tokens(i)
    ids, mask = row["input_ids"].tolist(), row["loss_mask"].tolist()
    return ids[: mask.index(True)] if True in mask else ids


def _chat_data(manifest_file: Path, manifest: Manifest) -> tuple[dict[str, Any], Any]:
    """(the data config, the chat data's path as extraction read it) from a manifest."""
    data = (manifest.fingerprint_inputs or {}).get("data")
    if not isinstance(data, dict) or "source" not in data:
        raise PromptError(
            f"{manifest_file}: fingerprint_inputs.data: expected the data config (with 'source'), got {data!r}"
        )
    # datasets of the first fingerprint scheme keep the path in their fingerprint inputs
    return data, manifest.provenance.get("data_path", data.get("path"))


def val_first_turns(dataset_dir: str | Path) -> Generator[tuple[str, list[dict[str, str]]], None, None]:
    """(conversation id, opening turn) of the dataset's validation split, in the split's order,
    once per conversation (several regenerated answers of one conversation share its prompt).
    Picked by id only: `RecordedPrompts` checks them by content."""
    dataset_dir = Path(dataset_dir)
    manifest = Manifest.read(dataset_dir)
    manifest_file = dataset_dir / "manifest.json"
    data, given = _chat_data(manifest_file, manifest)
    wanted = list(dict.fromkeys(conversation_of(i) for i in manifest.val_ids))
    if not wanted:
        return
    pending = set(wanted)
    found: dict[str, list[dict[str, str]]] = {}
    next_index = 0  # yield in val_ids order, as soon as the next one is known
    stream = iter_conversations(str(data["source"]), _data_path(manifest_file, given), hf=HFOptions.from_data(data))
    try:
        for conv in stream:
            if conv.id not in pending:
                continue
            pending.discard(conv.id)
            found[conv.id] = first_user_turn(conv.messages)
            while next_index < len(wanted) and wanted[next_index] in found:
                yield wanted[next_index], found.pop(wanted[next_index])
                next_index += 1
            if not pending:
                break
    finally:
        stream.close()
    if pending:
        missing = [i for i in wanted if i in pending][:5]
        raise PromptError(
            f"{manifest_file}: {len(pending)} validation ids not found in the chat source "
            f"(source={data['source']}, path={given}), e.g. {missing}: the source changed since extraction"
        )


class RecordedPrompts:
    """What a dataset recorded of its validation prompts, to check the re-read ones by content.

    Each validation sample stores the tokens extraction rendered; those before its first answer
    (loss-mask) token are the served prompt of its opening turn, tokenized on their own
    (eagle3/data/render.py), so they equal `render_prompt` of that turn, with the same tokenizer
    and chat template, token for token -- whether or not the answers were regenerated. When the
    samples cannot be read (only the manifest at hand), the chat file as a whole is compared with
    the content hash the dataset's fingerprint holds."""

    def __init__(self, dataset_dir: str | Path) -> None:
        self.dataset_dir = Path(dataset_dir)
        manifest_file = self.dataset_dir / "manifest.json"
        manifest = Manifest.read(self.dataset_dir)
        self.data, given = _chat_data(manifest_file, manifest)
        self.chat_file = str(given) if given is not None else f"hf:{self.data.get('name')}"
        self.samples: SampleFiles | None = None
        self.first_sample: dict[str, int] = {}  # conversation id -> its first validation sample
        self.unchecked: str | None = None  # why the prompts cannot be checked one by one
        try:
            self.samples = open_dataset(self.dataset_dir)
        except StoreError as err:
            self.unchecked = f"the dataset's samples cannot be read ({err})"
            self._check_whole_file(manifest_file, given)
            return
        self.first_sample = _first_val_samples(manifest)

    def _check_whole_file(self, manifest_file: Path, given: Any) -> None:
        recorded = self.data.get("content_sha")
        if recorded is None:  # a hub dataset, or a first-scheme dataset: nothing to compare with
            return
        try:
            path = resolve_path(str(self.data["source"]), _data_path(manifest_file, given))
        except DataError:  # no chat data here: val_first_turns says so
            return
        if path is None:
            return
        got = tree_sha(path, lambda p: file_sha256(p)[:16]) if path.is_dir() else file_sha256(path)[:16]
        if got != recorded:
            raise PromptError(
                f"{path}: content_sha: expected {recorded} (the chat data {manifest_file} was extracted from), "
                f"got {got}: the chat data changed since extraction, so its validation ids may name other "
                f"conversations, and {self.unchecked}, which would let each prompt be checked; bring the "
                "dataset's sample files, or the chat data as it was"
            )
        self.unchecked = None  # the very file: every id names the conversation it named

    def check(self, conversation_id: str, token_ids: list[int], tokenizer: Any) -> None:
        """Refuse a re-read prompt whose tokens differ from what the dataset stored for it."""
        i = self.first_sample.get(conversation_id)
        if self.samples is None or i is None:
            return
        expected = _stored_prompt(self.samples, i)
        if expected == token_ids:
            return
        at = next(
            (k for k, (a, b) in enumerate(zip(expected, token_ids)) if a != b), min(len(expected), len(token_ids))
        )

        start = max(0, at - 4)  # a little context before the first difference

        def text(tokens: list[int]) -> str:
            window = tokens[start : start + 40]
            shown = tokenizer.decode(window) if hasattr(tokenizer, "decode") else window
            return f"{len(tokens)} tokens, from token {start}: {shown!r}"

        raise PromptError(
            f"{self.chat_file}: validation conversation {conversation_id!r}: its opening turn as read now is not "
            f"the prompt the dataset {self.dataset_dir} stored for it (sample {self.samples.sample_id(i)!r}), "
            f"first different at token {at}: expected {text(expected)}, got {text(token_ids)}; the chat data changed since extraction (ids "
            "of an id-less JSONL are line positions, so an edit maps them onto other conversations), or the "
            "tokenizer or chat template differ from extraction's: evaluate with the data the dataset was made "
            "from, or extract again"
        )
