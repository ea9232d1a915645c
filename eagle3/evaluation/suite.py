"""The held-out prompt suite shipped with the package (eagle3/evaluation/suites/), the traffic a
server gets rather than the training set's own held-out turns.

- ``broad.jsonl``: 96 prompts written for this project, 12 in each of the eight MT-bench
  categories (writing, roleplay, reasoning, math, coding, extraction, stem, humanities), some
  with a second user turn.
- ``math_word.jsonl``: 24 grade-school word problems (a GSM8K-style set: no installed package
  ships GSM8K, so the project writes its own).

One record per line: ``{"id": str, "category": str, "turns": [str, ...]}`` (1 or 2 user turns).
The files live inside the evaluation package, not under a data source: no data loader's config
names them and extraction never reads them, so they never reach training or the choice of a
checkpoint (tests/integration/test_broad_suite_data.py checks both).

A run that takes fewer prompts than a file holds takes them stratified: one category after the
other in turn (round robin, each category in file order), so 8 prompts are one per category.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SUITE_DIR = Path(__file__).with_name("suites")
BROAD = "broad"
MATH_WORD = "math_word"
SUITE_FILES = {BROAD: SUITE_DIR / "broad.jsonl", MATH_WORD: SUITE_DIR / "math_word.jsonl"}
CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


class SuiteError(ValueError):
    """A suite file's record is malformed (names the file, line, field, expected and got)."""


@dataclass(frozen=True)
class SuitePrompt:
    id: str
    category: str
    turns: tuple[str, ...]  # user turns: the second is asked after the target's own answer to the first


def read_suite(name: str) -> list[SuitePrompt]:
    """Every record of a suite file, in file order, checked."""
    if name not in SUITE_FILES:
        raise SuiteError(f"suite {name!r}: expected one of {sorted(SUITE_FILES)}")
    path = SUITE_FILES[name]
    out: list[SuitePrompt] = []
    seen: set[str] = set()
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        where = f"{path} line {line_no}"
        if not isinstance(row.get("id"), str) or row["id"] in seen:
            raise SuiteError(f"{where}: id: expected a unique string, got {row.get('id')!r}")
        if not isinstance(row.get("category"), str):
            raise SuiteError(f"{where}: category: expected a string, got {row.get('category')!r}")
        turns = row.get("turns")
        if not isinstance(turns, list) or not 1 <= len(turns) <= 2 or not all(isinstance(t, str) and t for t in turns):
            raise SuiteError(f"{where}: turns: expected 1 or 2 non-empty strings, got {turns!r}")
        seen.add(row["id"])
        out.append(SuitePrompt(row["id"], row["category"], tuple(turns)))
    return out


def stratified(prompts: list[SuitePrompt], n: int) -> list[SuitePrompt]:
    """``n`` prompts taken round robin over the categories (in order of first appearance), each
    category in file order: every category is represented as evenly as ``n`` allows."""
    by_cat: dict[str, list[SuitePrompt]] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p)
    out: list[SuitePrompt] = []
    depth = 0
    while len(out) < n and any(depth < len(v) for v in by_cat.values()):
        for items in by_cat.values():
            if depth < len(items) and len(out) < n:
                out.append(items[depth])
        depth += 1
    return out


def suite_prompts(name: str, n: int) -> list[SuitePrompt]:
    """``n`` prompts of a suite file (all of them when it holds fewer), stratified by category."""
    return stratified(read_suite(name), max(0, n))
