"""``data.mixture``: conversations drawn from several sources, each by its weight.

Each draw picks a source with probability weight / (sum of the weights of the sources still
open), from a ``random.Random`` seeded by ``data.seed``, and takes that source's next
conversation (file order, as the single-source loaders give it). A source that runs out, or
reaches its own ``max_samples``, closes and the others share its draws. The order of draws is a
function of the seed alone, so growing ``data.max_samples`` only adds samples.

Every conversation is tagged with its source: its id (and split key) reads "<name>/<id>", so the
counts per source can be read off any sample id (``source_of``), the train/val split of one
source never depends on another, and two sources with the same ids never collide.

A source may have its own serving mode (``chat_template_kwargs``, ``system_prompt``): its system
prompt goes into its conversations here, its template arguments travel with each conversation
(``Conversation.template_kwargs``) to the regeneration and the rendering.

Sources are the loaders' (sharegpt, jsonl, hf_disk, hf) or ``self_prompts``: user turns the target
writes itself. Nothing here runs a model: the extraction hands in ``self_prompts``, a callable
that gives a source's stream of one-user-turn conversations (eagle3/target_model/generate/
self_prompts.py); the target answers them like any regenerated record.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterator

from eagle3.data.conversation import Conversation, DataError
from eagle3.data.hf_source import HFOptions
from eagle3.data.loaders import LoadReport, iter_conversations
from eagle3.data.render import with_system_prompt

SELF_PROMPTS = "self_prompts"
TAG_SEP = "/"
KINDS = ("sharegpt", "jsonl", "hf_disk", "hf", SELF_PROMPTS)

SelfPromptsFactory = Callable[[dict[str, Any]], Iterator[Conversation]]


def tag(name: str, conversation_id: str) -> str:
    return f"{name}{TAG_SEP}{conversation_id}"


def source_of(sample_id: str) -> str:
    """The mixture source a sample id was drawn from (its tag)."""
    return sample_id.split(TAG_SEP, 1)[0]


@dataclass
class SourceCount:
    weight: float  # normalised: its share of the draws while every source is open
    drawn: int = 0  # conversations handed on
    closed: str | None = None  # why it stopped giving conversations, if it did
    report: LoadReport | None = None


@dataclass
class MixtureReport:
    """Per source: its weight, the conversations drawn, the samples kept (train / val)."""

    sources: dict[str, SourceCount] = field(default_factory=dict)
    train: Counter = field(default_factory=Counter)
    val: Counter = field(default_factory=Counter)

    def kept(self, sample_id: str, val: bool) -> None:
        (self.val if val else self.train)[source_of(sample_id)] += 1

    def rows(self) -> list[tuple[str, str]]:
        out = []
        for name, s in self.sources.items():
            closed = f"; {s.closed}" if s.closed else ""
            out.append(
                (
                    f"source {name}",
                    f"weight {s.weight:.3f}: {s.drawn} drawn, {self.train[name]} / {self.val[name]} train / val "
                    f"samples{closed}",
                )
            )
        return out

    def counts(self) -> dict[str, dict[str, Any]]:
        """What the dataset's manifest records (``provenance.mixture``)."""
        return {
            name: {"weight": round(s.weight, 6), "drawn": s.drawn, "train": self.train[name], "val": self.val[name]}
            for name, s in self.sources.items()
        }


def counts_of(samples: list[Any], val_ids: list[str], weights: dict[str, float]) -> dict[str, dict[str, Any]]:
    """{source: {weight, samples, val}} of the samples a dataset holds (after any budget cut)."""
    val = set(val_ids)
    total: Counter[str] = Counter()
    held: Counter[str] = Counter()
    for s in samples:
        total[source_of(s.id)] += 1
        held[source_of(s.id)] += s.id in val
    return {n: {"weight": round(w, 6), "samples": total[n], "val": held[n]} for n, w in weights.items()}


def _entries(mixture: list[dict[str, Any]], regenerate: bool) -> list[dict[str, Any]]:
    """The mixture's entries, checked: names unique and tag-safe, weights >= 0 (one > 0)."""
    if not mixture:
        raise DataError("data.mixture: expected at least one source, got none")
    names = Counter(str(e.get("name")) for e in mixture)
    for i, e in enumerate(mixture):
        where = f"data.mixture[{i}] ({e.get('name')})"
        name, kind, weight = str(e.get("name") or ""), e.get("source"), e.get("weight", 1.0)
        if not name or TAG_SEP in name or names[name] > 1:
            raise DataError(f"{where}.name: expected a unique non-empty name without {TAG_SEP!r}, got {name!r}")
        if kind not in KINDS:
            raise DataError(f"{where}.source: expected one of {list(KINDS)}, got {kind!r}")
        if not isinstance(weight, (int, float)) or weight < 0:
            raise DataError(f"{where}.weight: expected a number >= 0, got {weight!r}")
        kwargs = e.get("chat_template_kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise DataError(f"{where}.chat_template_kwargs: expected a mapping or null, got {kwargs!r}")
        cap = e.get("max_samples")
        if cap is not None and int(cap) <= 0:
            raise DataError(f"{where}.max_samples: expected a positive count or null, got {cap!r}")
        if kind == SELF_PROMPTS and not regenerate:
            raise DataError(
                f"{where}.source: self_prompts are user turns only: expected data.regenerate=true (the target "
                "answers them), got false"
            )
    if sum(float(e.get("weight", 1.0)) for e in mixture) <= 0:
        raise DataError(f"data.mixture: expected a weight > 0 somewhere, got {[e.get('weight') for e in mixture]}")
    return [dict(e) for e in mixture]


def weights(mixture: list[dict[str, Any]]) -> dict[str, float]:
    """{name: weight / sum of the weights}."""
    total = sum(float(e.get("weight", 1.0)) for e in mixture)
    return {str(e["name"]): float(e.get("weight", 1.0)) / total for e in mixture}


class Mixture:
    """The sources of ``data.mixture`` (plain dicts: ``plain(cfg.data)["mixture"]``) and the seed
    of their draws; ``stream`` yields the tagged conversations and fills ``report``."""

    def __init__(
        self,
        mixture: list[dict[str, Any]],
        seed: int,
        *,
        regenerate: bool,
        self_prompts: SelfPromptsFactory | None = None,
        max_samples: int | None = 0,
    ) -> None:
        """``max_samples``: data.max_samples (None: every source to its end, so a self_prompts
        source, which has none, needs a cap of its own; 0: the caller stops the stream itself)."""
        self.entries = _entries(mixture, regenerate)
        endless = [e["name"] for e in self.entries if e["source"] == SELF_PROMPTS and e.get("max_samples") is None]
        if max_samples is None and endless:
            raise DataError(
                f"data.mixture source {endless[0]}: self_prompts never run out: expected data.max_samples or the "
                "source's own max_samples, got null for both"
            )
        self.seed = int(seed)
        self.self_prompts = self_prompts
        self.report = MixtureReport({n: SourceCount(w) for n, w in weights(self.entries).items()})

    def _open(self, entry: dict[str, Any]) -> Iterator[Conversation]:
        name, kind = str(entry["name"]), str(entry["source"])
        if kind == SELF_PROMPTS:
            if self.self_prompts is None:
                raise DataError(f"data.mixture source {name}: self_prompts need the target: none was given")
            return self.self_prompts(entry)
        report = LoadReport(kind, str(entry.get("path")))
        self.report.sources[name].report = report
        return iter_conversations(kind, entry.get("path"), report, hf=HFOptions.from_data(entry))

    def draws(self) -> Generator[str, bool, None]:
        """Source names, one per draw, seeded; ``close(name)`` (via send) is handled by stream."""
        rng = random.Random(f"mixture\x00{self.seed}")
        open_ = {str(e["name"]): float(e.get("weight", 1.0)) for e in self.entries if float(e.get("weight", 1.0)) > 0}
        while open_:
            names = list(open_)
            pick = rng.choices(names, weights=[open_[n] for n in names])[0]
            if (yield pick):  # the stream sends True when that source is closed
                del open_[pick]

    def stream(self, report: LoadReport) -> Generator[Conversation, None, None]:
        """Tagged conversations in draw order; ``report`` gets the sources' totals."""
        report.source = "mixture"
        report.path = ", ".join(
            f"{e['name']}: {e['source']}" + (f" {e['path']}" if e.get("path") else "") for e in self.entries
        )
        iters: dict[str, Iterator[Conversation]] = {}
        by_name = {str(e["name"]): e for e in self.entries}
        caps: dict[str, int | None] = {name: e.get("max_samples") for name, e in by_name.items()}
        draws = self.draws()
        try:
            name = next(draws, None)
            while name is not None:
                counts = self.report.sources[name]
                if name not in iters:
                    iters[name] = self._open(by_name[name])
                cap = caps[name]
                capped = cap is not None and counts.drawn >= cap
                conv = None if capped else next(iters[name], None)
                if conv is None:
                    counts.closed = f"max_samples={cap} reached" if capped else "ran out"
                    name = _send(draws, True)
                    continue
                counts.drawn += 1
                entry = by_name[name]
                yield Conversation(
                    tag(name, conv.id),
                    with_system_prompt(conv.messages, entry.get("system_prompt")),
                    tag(name, conv.split_key),
                    template_kwargs=dict(entry["chat_template_kwargs"]) if entry.get("chat_template_kwargs") else None,
                )
                name = _send(draws, False)
        finally:
            for it in iters.values():
                close = getattr(it, "close", None)
                if close is not None:
                    close()
            _totals(report, self.report)
        report.complete = all(s.closed == "ran out" for s in self.report.sources.values() if s.weight > 0)


def _send(draws: Generator[str, bool, None], closed: bool) -> str | None:
    try:
        return draws.send(closed)
    except StopIteration:
        return None


def _totals(report: LoadReport, mixture: MixtureReport) -> None:
    """The sources' load counts summed into the pipeline's report (reasons named by source)."""
    for name, s in mixture.sources.items():
        sub = s.report
        if sub is None:
            report.usable += s.drawn  # self-prompts: every one handed on is usable
            report.records_read += s.drawn
            continue
        sub.check_json_lines()
        report.records_read += sub.records_read
        report.usable += sub.usable
        report.skipped.update({f"{name}: {k}": n for k, n in sub.skipped.items()})
        report.repaired.update({f"{name}: {k}": n for k, n in sub.repaired.items()})
