"""Chat data -> rendered, masked, split samples: the data stage in one call.

    load (lazy, file order) -> [regenerate assistant turns] -> render + mask -> split

``max_samples`` caps the samples *kept* (train + val), in file order, and reading stops
as soon as it is reached, so a 2000-sample run does not parse a 125 MB file. Which side
a sample lands on is a hash of its split key (split.py), so growing ``max_samples`` only
adds samples: every sample of the smaller run keeps its side.

``Regeneration.regenerate`` is the hook for answers written by the target itself: a callable that
takes a batch of loaded `Conversation`s and returns, for each in order, its
``regenerate.num_answers`` answered copies (ids ``answer_id(id, k)``, the split key kept, so
every answer of a conversation lands on its side of the split) with the assistant turns
replaced. It runs before rendering, on batches of ``Regeneration.batch_size``, only on
conversations the run still needs. With ``Regeneration.deadline`` (a time budget's share), no batch
starts that would end after it at the rate of the batches before: the samples kept are those
answered in time.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping

import torch

from eagle3.data.conversation import Conversation, DataError, answer_id
from eagle3.data.hf_source import HFOptions
from eagle3.data.json_stream import DEFAULT_MAX_BAD_FRACTION
from eagle3.data.loaders import LoadReport, iter_conversations, no_usable_data_error
from eagle3.data.mixture import Mixture, MixtureReport
from eagle3.data.render import ChatRenderer, ChatStyle, with_system_prompt
from eagle3.data.split import check_val_fraction, is_validation
from eagle3.util.clock import Deadline

Regenerate = Callable[[list[Conversation]], list[Conversation]]


@dataclass(frozen=True)
class ChatSource:
    """Where the conversations come from: data.source read from ``path``, or data.mixture's
    sources in their draw order (``mixture``, in place of source and path)."""

    source: str  # data.source (jsonl, sharegpt, hf, ...; "mixture" with ``mixture``)
    path: str | None = None
    hf: HFOptions | None = None  # name, split and columns of source="hf" (HFOptions.from_data(cfg.data))
    mixture: Mixture | None = None
    max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION  # of a JSONL file's lines, before reading fails


@dataclass(frozen=True)
class Regeneration:
    """The target answering the conversations before they are rendered (the module doc says how):
    ``regenerate`` on batches of ``batch_size`` conversations; with ``deadline`` (a time budget's
    share of regeneration) no batch starts that would end after it."""

    regenerate: Regenerate
    batch_size: int = 64  # conversations per call (data.regen_batch_size)
    deadline: Deadline | None = None


@dataclass
class PreparedSample:
    id: str
    input_ids: torch.Tensor  # int64 [T]
    loss_mask: torch.Tensor  # bool [T], True on generated assistant tokens
    messages: list[dict[str, str]]  # the conversation rendered (evaluation takes its first user turn)
    split_key: str = ""


@dataclass
class PrepareReport:
    load: LoadReport
    max_samples: int | None = None
    conversations_rendered: int = 0
    skipped: Counter = field(default_factory=Counter)  # render skip reason -> conversations
    truncated: int = 0  # kept samples cut to max_length
    train_samples: int = 0
    val_samples: int = 0
    tokens: int = 0  # in kept samples
    loss_tokens: int = 0
    deadline_stop: str | None = None  # why regeneration stopped at its deadline, if it did
    mixture: MixtureReport | None = None  # data.mixture: the counts per source
    regen_seconds: float = 0.0  # the regeneration batches' wall time, the engine's start left out
    regen_engine_start_s: float = 0.0  # the regeneration engine's start (0: none started here)

    def regen_tok_s(self) -> float | None:
        """Answer tokens kept per second of regeneration (a floor of the engine's rate: the answers of
        dropped samples and cut tails are not counted); None without regeneration."""
        return self.loss_tokens / self.regen_seconds if self.regen_seconds > 0 and self.loss_tokens else None

    def rows(self) -> list[tuple[str, str]]:
        load = self.load
        rows = [
            ("source", f"{load.source} ({load.path})"),
            ("records read", str(load.records_read)),
            ("usable conversations read", str(load.usable)),
        ]
        if load.cut_off:
            rows.append(
                (
                    "file stopped",
                    f"at byte {load.stop_offset_bytes}: {load.stop_reason}; "
                    f"recovered {load.records_read} whole records",
                )
            )
        if load.stopped_at_limit:
            rows.append(("stopped early", f"max_samples={self.max_samples} reached"))
        if self.deadline_stop:
            rows.append(("stopped early", self.deadline_stop))
        if load.bad_json_lines:
            rows.append(("skipped (load): lines not JSON", load.bad_lines_row()))
        rows += [(f"skipped (load): {k}", str(n)) for k, n in sorted(load.skipped.items())]
        rows += [(f"repaired (load): {k}", str(n)) for k, n in sorted(load.repaired.items())]
        rows.append(("conversations rendered", str(self.conversations_rendered)))
        rows += [(f"skipped (render): {k}", str(n)) for k, n in sorted(self.skipped.items())]
        rows += [
            ("truncated to max_length", str(self.truncated)),
            ("train / val samples", f"{self.train_samples} / {self.val_samples}"),
            ("tokens / loss tokens", f"{self.tokens} / {self.loss_tokens}"),
        ]
        return rows + (self.mixture.rows() if self.mixture is not None else [])

    def summary(self) -> str:
        return "\n".join(f"{k}: {v}" for k, v in self.rows())

    def print(self) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="chat data", show_header=False)
        table.add_column("what", no_wrap=True)
        table.add_column("count", overflow="fold")
        for what, count in self.rows():
            table.add_row(what, count)
        Console(stderr=True).print(table)


@dataclass
class PreparedData:
    train: list[PreparedSample]
    val: list[PreparedSample]
    report: PrepareReport


def _batches(
    conversations: Iterator[Conversation], size: Callable[[], int], pace: "_RegenPace | None" = None
) -> Iterator[list[Conversation]]:
    """Batches of ``size()`` conversations; ``pace``: the reading counts in regeneration's pace
    (a mixture's self-prompts are written by the target as they are read)."""
    while True:
        batch: list[Conversation] = []
        want = max(1, size())
        with pace.timed(0) if pace is not None else nullcontext():
            for conv in conversations:
                batch.append(conv)
                if len(batch) >= want:
                    break
        if not batch:
            return
        yield batch


def _answers(regenerate: Regenerate | None) -> int:
    return int(getattr(regenerate, "num_answers", 1)) if regenerate is not None else 1


def _checked_regenerate(regenerate: Regenerate, batch: list[Conversation]) -> list[Conversation]:
    out = regenerate(batch)
    n = _answers(regenerate)
    want = [(answer_id(c.id, k), c.split_key) for c in batch for k in range(n)]
    got = [(c.id, c.split_key) for c in out]
    if got != want:
        raise DataError(
            f"regenerate must return, in order, num_answers={n} answered copies of each conversation keeping its "
            "split key: "
            f"expected (id, split key) {want[:5]}..., got {got[:5]}..."
        )
    return out


# the share of regeneration's time left that a last, smaller batch is sized to (see _RegenPace.fitting)
TAIL_MARGIN = 0.85


class _RegenPace:
    """Seconds per conversation of the regeneration batches so far, the engine's start left out
    (``regenerate.engine_start_s``, where the regenerator records it): what the next batch will take."""

    def __init__(self, regenerate: Regenerate | None) -> None:
        self.regenerate = regenerate
        self.seconds, self.conversations = 0.0, 0

    @contextmanager
    def timed(self, conversations: int) -> Iterator[None]:
        started, engine_before = time.monotonic(), self._engine_start()
        yield
        self.seconds += time.monotonic() - started - (self._engine_start() - engine_before)
        self.conversations += conversations

    def _engine_start(self) -> float:
        return float(getattr(self.regenerate, "engine_start_s", 0.0) or 0.0)

    def per_conversation(self) -> float:
        """Seconds per conversation so far (0 before any batch was timed)."""
        return self.seconds / self.conversations if self.conversations else 0.0

    def fitting(self, deadline: Deadline) -> int | None:
        """Conversations the time left fits at the pace so far, None before any batch was timed. A
        batch is not all throughput: its longest answers finish alone, so a smaller batch runs at a
        lower rate; TAIL_MARGIN keeps that out of the time left."""
        pace = self.per_conversation()
        return max(0, int(deadline.left() * TAIL_MARGIN / pace)) if pace > 0 else None

    def stop(self, deadline: Deadline, conversations: int) -> str | None:
        """Why the next batch of ``conversations`` must not start, or None. The first batch always
        starts, however late: a share used up before it (the engine's start, the prompts written)
        would otherwise leave a dataset with nothing answered; the budget's clocks after it (capture,
        training) absorb the overrun."""
        left = deadline.left()
        expected = self.per_conversation() * conversations
        if left > expected or not self.conversations:
            return None
        return (
            f"{deadline.what} deadline (time_budget): {self.conversations} conversations regenerated; the next "
            f"{conversations} would take ~{expected:.0f} s, {max(0.0, left):.0f} s were left"
        )


class _Renderers:
    """The renderer of each conversation: data.chat_template_kwargs', or its own (a mixture source's
    mode: ``Conversation.template_kwargs``), one per distinct set of arguments."""

    def __init__(self, tokenizer: Any, chat_template: str | None, template_kwargs: Mapping[str, Any] | None) -> None:
        self.tokenizer, self.chat_template = tokenizer, chat_template
        self.default = ChatRenderer(tokenizer, chat_template, template_kwargs)
        self.own: dict[str, ChatRenderer] = {}

    def of(self, conv: Conversation) -> ChatRenderer:
        if conv.template_kwargs is None:
            return self.default
        key = json.dumps(conv.template_kwargs, sort_keys=True, default=str)
        if key not in self.own:
            self.own[key] = ChatRenderer(self.tokenizer, self.chat_template, conv.template_kwargs)
        return self.own[key]


class _Kept:
    """The samples rendered so far, each on its side of the split, and their counts in ``report``."""

    def __init__(
        self,
        renderers: _Renderers,
        report: PrepareReport,
        max_length: int,
        overflow: str,
        val_fraction: float,
        seed: int,
    ) -> None:
        self.renderers, self.report = renderers, report
        self.max_length, self.overflow, self.val_fraction, self.seed = max_length, overflow, val_fraction, seed
        self.train: list[PreparedSample] = []
        self.val: list[PreparedSample] = []

    def count(self) -> int:
        return len(self.train) + len(self.val)

    def add(self, conv: Conversation) -> bool:
        """Render ``conv`` into a sample and keep it; False (the reason counted) when it gives none."""
        report = self.report
        if not any(m["role"] == "assistant" for m in conv.messages):
            # regeneration could not answer any turn (the prompt alone filled max_length)
            report.skipped["regenerated_no_answer"] += 1
            return False
        report.conversations_rendered += 1
        result = self.renderers.of(conv)(conv.messages, self.max_length, self.overflow)
        if result.sample is None:
            report.skipped[result.skip_reason] += 1
            return False
        sample = PreparedSample(
            conv.id, result.sample.input_ids, result.sample.loss_mask, conv.messages, conv.split_key
        )
        in_val = is_validation(conv.split_key, self.val_fraction, self.seed)
        (self.val if in_val else self.train).append(sample)
        if report.mixture is not None:
            report.mixture.kept(sample.id, in_val)
        report.truncated += int(result.truncated)
        report.tokens += sample.input_ids.numel()
        report.loss_tokens += int(sample.loss_mask.sum())
        return True


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("rendering chat data"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not enabled,
        transient=True,
    )


def prepare_samples(
    chats: ChatSource,
    tokenizer: Any,
    *,
    max_samples: int | None,
    max_length: int,
    overflow: str,
    val_fraction: float,
    seed: int,
    style: ChatStyle = ChatStyle(),
    progress: bool = True,
    regeneration: Regeneration | None = None,
) -> PreparedData:
    """The samples of ``chats``, rendered as ``style`` says the deployment calls the chat template
    (by default the tokenizer's, with no arguments and no system prompt). The system prompt is put
    in each conversation before the target answers it, so regenerated answers and rendered samples
    both see it. ``regeneration``: the target answers the conversations first."""
    if max_samples is not None and max_samples <= 0:
        raise DataError(f"max_samples must be positive or null, got {max_samples}")
    check_val_fraction(val_fraction)  # before any work
    source, path, mixture = getattr(chats.source, "value", chats.source), chats.path, chats.mixture
    regenerate = regeneration.regenerate if regeneration is not None else None
    renderers = _Renderers(tokenizer, style.template, style.kwargs)
    load_report = LoadReport(source, str(path), max_bad_fraction=chats.max_bad_fraction)
    report = PrepareReport(
        load=load_report, max_samples=max_samples, mixture=None if mixture is None else mixture.report
    )
    kept = _Kept(renderers, report, max_length, overflow, val_fraction, seed)

    def batch_size() -> int:
        if regeneration is None:
            return 1
        size = regeneration.batch_size
        if max_samples is not None:
            size = min(size, -(-(max_samples - kept.count()) // _answers(regenerate)))  # conversations
        # near regeneration's deadline a batch is cut to what the time left answers, rather than a
        # whole batch refused and that time lost (a machine that answers 4,096 conversations in
        # 41 s would leave up to 40 s unused); nothing fits: the whole batch, which the deadline stops
        deadline = regeneration.deadline
        if deadline is None:
            return size
        fits = pace.fitting(deadline)
        if fits is None and deadline.first_batch:  # no pace measured yet: the plan's first batch
            return min(size, deadline.first_batch)
        return min(size, fits) if fits else size

    def full() -> bool:
        return max_samples is not None and kept.count() >= max_samples

    stream = (
        mixture.stream(load_report)
        if mixture is not None
        else iter_conversations(source, path, load_report, hf=chats.hf)
    )
    pace = _RegenPace(regenerate)
    with _progress(progress) as bar:
        task = bar.add_task("render", total=max_samples)
        for batch in _batches(stream, batch_size, pace if regeneration is not None else None):
            if style.system_prompt is not None:
                batch = [replace(c, messages=with_system_prompt(c.messages, style.system_prompt)) for c in batch]
            if regeneration is not None:
                deadline = regeneration.deadline
                if deadline is not None and (why := pace.stop(deadline, len(batch))):
                    report.deadline_stop = why
                    stream.close()
                    break
                with pace.timed(len(batch)):
                    batch = _checked_regenerate(regeneration.regenerate, batch)
            for conv in batch:
                if kept.add(conv):
                    bar.advance(task)
                if full():
                    break
            if full():
                load_report.stopped_at_limit = True
                stream.close()
                break
    train, val = kept.train, kept.val
    report.train_samples, report.val_samples = len(train), len(val)
    report.regen_seconds, report.regen_engine_start_s = pace.seconds, pace._engine_start()
    load_report.check_json_lines()  # the lines read, when max_samples or the deadline stopped the reading
    if load_report.usable == 0:
        raise no_usable_data_error(load_report)
    if kept.count() == 0:
        render_why = ", ".join(f"{k}: {n}" for k, n in sorted(report.skipped.items())) or "no reason counted"
        if report.deadline_stop:
            render_why += f"; regeneration {report.deadline_stop}"
        raise DataError(
            f"no usable samples: {load_report.usable} conversations loaded from {load_report.path}, "
            f"all dropped when rendering ({render_why}; max_length={max_length}, overflow={overflow})"
        )
    report.print()
    return PreparedData(train, val, report)
