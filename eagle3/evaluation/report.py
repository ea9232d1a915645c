"""The acceptance report: one JSON file (acceptance.json) and a table on stderr.

Top-level keys are the figures over the held-out suite (``headline`` names its sets: the broad
suite, the math word problems, HumanEval), answers ending at natural EOS; ``interval`` is their
bootstrap interval over prompts. ``by_source`` has the same figures per prompt set, the
validation split (``val``) among them, and ``in_distribution`` repeats that one beside the
headline, labelled "validation split (in-distribution)": it is the training data's own
distribution, not the traffic a server gets. ``by_category`` breaks the sets down (the suite's
eight categories). ``measured_by`` says these are vLLM's serving counters, not the
training-time simulation (``val/sim_accept_len``): the two differ, and users compare them.

``interval_method`` says how the intervals were made (and, with eval.prompts_apart, that each
prompt's figures come from the counters read around its own call; with eval.step_figures, from the
tokens of each engine step), or "n/a: <why>" where there are
no per-request figures: every interval is then the string "n/a", in the JSON and the table alike
(null stays for a set of under two prompts with drafts: no spread to resample). The engines'
tokens/s ratio is ``eval_engines_tok_s_ratio`` (``eval_engines_tok_s_ratio_is`` says what it
is): the evaluation's engines, not a serving speed-up, which serving.json alone holds.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from eagle3.draft.export_files import ACCEPTANCE, ACCEPTANCE_PLOT
from eagle3.evaluation.figures import Figures, PromptOutcome
from eagle3.evaluation.intervals import METHOD
from eagle3.evaluation.prompts import SET_LABELS, VAL
from eagle3.util.atomic import write_text

MEASURED_BY = "vLLM spec-decode counters (real serving acceptance, greedy)"
ENDS = "natural EOS (ignore_eos=false), capped at max_new_tokens"
JSON_NAME = ACCEPTANCE
PNG_NAME = ACCEPTANCE_PLOT
NOT_AVAILABLE = "n/a"  # an interval without per-request figures (interval_method says why)


@dataclass
class AcceptanceReport:
    export_dir: str
    target: str
    num_draft_tokens: int
    max_new_tokens: int
    overall: Figures
    by_source: dict[str, Figures]
    prompt_counts: dict[str, int]
    dataset_dir: Optional[str] = None
    prompt_notes: list[str] = field(default_factory=list)
    skipped_too_long: dict[str, int] = field(default_factory=dict)
    per_prompt: list[PromptOutcome] = field(default_factory=list)
    engine: dict[str, Any] = field(default_factory=dict)  # vLLM version, platform, eager, load times
    consistency_problems: list[str] = field(default_factory=list)
    # the diagnostics, empty unless eval.diagnostics: greedy mismatches explained by an fp32
    # reference forward (eagle3/evaluation/diagnostics/mismatch.py; without it greedy_mismatches still lists
    # them, unexplained), ...
    mismatch_verdicts: list[dict[str, Any]] = field(default_factory=list)
    # ... the same val prompts replayed by the head on the dataset's answers (eagle3/draft/replay.py)
    train_side_replay: dict[str, float] = field(default_factory=dict)
    # ... and the head replayed on vLLM's own with-head outputs, per source and "all" (served_replay.py)
    served_replay: dict[str, dict[str, float]] = field(default_factory=dict)
    # (prompt ids, with-head output ids) per source: what served_replay reads; not in the JSON
    served: dict[str, list] = field(default_factory=dict, repr=False)
    measured_by: str = MEASURED_BY
    headline_sets: list[str] = field(default_factory=list)  # the sets `overall` pools
    # per category: its set, prompts, pooled acceptance, per-position rates and interval
    by_category: dict[str, dict[str, Any]] = field(default_factory=dict)
    # per set and "held_out" (the headline): the bootstrap interval, or None (no per-request figures)
    intervals: dict[str, Optional[dict[str, Any]]] = field(default_factory=dict)
    # why there are no intervals at all (vLLM gave no per-request figures); None: there are
    no_interval_reason: Optional[str] = None
    # where each prompt's figures come from when not vLLM's per-request ones (eval.prompts_apart:
    # the counters read around each prompt's own call; eval.step_figures: each engine step's
    # tokens); None: vLLM's, or there are none
    figures_source: Optional[str] = None

    @property
    def headline_key(self) -> str:
        return "held_out" if self.headline_sets != [VAL] else VAL

    @property
    def mean_acceptance_length(self) -> float:
        return self.overall.mean_acceptance_length

    @property
    def interval_method(self) -> str:
        if self.no_interval_reason is not None:
            return f"{NOT_AVAILABLE}: {self.no_interval_reason}"
        return METHOD if self.figures_source is None else f"{METHOD}; {self.figures_source}"

    def interval_or_na(self, interval: Optional[dict[str, Any]]) -> Any:
        """An interval as acceptance.json holds it: itself, "n/a" without per-request figures, or None."""
        return NOT_AVAILABLE if interval is None and self.no_interval_reason is not None else interval

    def to_dict(self) -> dict[str, Any]:
        top = self.overall.to_dict()
        top.pop("prompts")
        interval = self.intervals.get(self.headline_key)
        val = self.by_source.get(VAL)
        return {
            "measured_by": self.measured_by,
            "export_dir": self.export_dir,
            "verifier": self.target,
            "dataset_dir": self.dataset_dir,
            "max_new_tokens": self.max_new_tokens,
            "ends": ENDS,
            "ended_at_eos": _ended_at_eos(self.per_prompt, set(self.headline_sets)),
            "headline": {
                "label": SET_LABELS[self.headline_key],
                "sets": list(self.headline_sets),
                "prompts": self.overall.prompts,
            },
            **top,
            "eval_engines_tok_s_ratio_is": eval_ratio_is(self.engine),
            "interval_method": self.interval_method,
            "interval": self.interval_or_na(interval),
            "per_position_acceptance_rate_lower": interval["per_position_lower"] if interval else None,
            "in_distribution": None
            if val is None
            else {
                "label": SET_LABELS[VAL],
                "prompts": val.prompts,
                "mean_acceptance_length": val.mean_acceptance_length,
                "per_position_acceptance_rate": list(val.per_position_acceptance_rate),
                "interval": self.interval_or_na(self.intervals.get(VAL)),
            },
            "prompts": dict(self.prompt_counts),
            "set_labels": {name: SET_LABELS.get(name, name) for name in self.by_source},
            "intervals": {name: self.interval_or_na(i) for name, i in self.intervals.items()},
            "by_category": {
                name: {**fig, "interval": self.interval_or_na(fig.get("interval"))}
                for name, fig in self.by_category.items()
            },
            "prompt_notes": list(self.prompt_notes),
            "skipped_too_long": dict(self.skipped_too_long),
            "by_source": {name: fig.to_dict() for name, fig in self.by_source.items()},
            "greedy_mismatches": [
                {
                    "source": p.source,
                    "id": p.id,
                    "first_difference": p.first_difference,
                    **next((v for v in self.mismatch_verdicts if v["id"] == p.id), {}),
                }
                for p in self.per_prompt
                if p.greedy_match is False
            ],
            "engine": dict(self.engine),
            "consistency_problems": list(self.consistency_problems),
            "train_side_replay": dict(self.train_side_replay),
            "served_replay": {k: dict(v) for k, v in self.served_replay.items()},
            "per_prompt": [asdict(p) for p in self.per_prompt],
        }


def eval_ratio_is(engine: dict[str, Any]) -> str:
    """What ``eval_engines_tok_s_ratio`` is, with the facts of the engines that gave it."""
    eager = engine.get("enforce_eager")
    mode = "eager" if eager else "compiled" if eager is not None else "?"
    together = "the sets in one call" if engine.get("sets_run_together") else "each set (or category) its own calls"
    return (
        f"tokens/s with the head over the target alone in the evaluation's two engines ({mode}, up to "
        f"{engine.get('max_num_seqs', '?')} requests at once, {together}): not a serving figure; the serving "
        "speed-up is serving.json's (python evaluate.py export_dir=<export> serving.measure=true)"
    )


def _ended_at_eos(per_prompt: list[PromptOutcome], sets: set[str]) -> Optional[float]:
    """The share of the headline's answers that ended at EOS rather than at max_new_tokens."""
    reasons = [p.finish_reason for p in per_prompt if p.source in sets and p.finish_reason]
    return sum(r == "stop" for r in reasons) / len(reasons) if reasons else None


def _json_safe(x: Any) -> Any:
    """NaN/inf are not JSON: they become null (e.g. a rate over zero drafts)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def write_json(report: AcceptanceReport, out_dir: str | Path) -> Path:
    path = Path(out_dir) / JSON_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(_json_safe(report.to_dict()), indent=2, allow_nan=False))
    return path


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _interval(interval: Optional[dict[str, Any]], report: AcceptanceReport) -> str:
    if not interval:
        return NOT_AVAILABLE if report.no_interval_reason is not None else "-"
    lo, hi = interval["mean_acceptance_length"]
    return f"{lo:.2f}-{hi:.2f}"


def category_table(report: AcceptanceReport) -> Any:
    """Per category: prompts, acceptance length and its interval, per-position rates."""
    from rich.table import Table

    k = report.num_draft_tokens
    source = (
        "vLLM per-request figures"
        if report.no_interval_reason is None
        else f"vLLM engine counters around each category's own call; intervals {NOT_AVAILABLE}"
    )
    table = Table(title=f"per category ({source}; a two-turn prompt counts once)")
    for name in ("category", "set", "n", "accept len", "95% interval", *[f"pos {i}" for i in range(k)]):
        table.add_column(name, justify="left" if name in ("category", "set") else "right")
    for name, c in report.by_category.items():
        rates = list(c["per_position_acceptance_rate"])[:k]
        table.add_row(
            name, c["set"], str(c["prompts"]), _fmt(c["mean_acceptance_length"]), _interval(c["interval"], report),
            *[_fmt(r) for r in rates],
        )  # fmt: skip
    return table


def _target_line(engine: dict[str, Any]) -> str:
    """ " against the target served as fp8" where the engines ran a quantized target, else ""."""
    quantization = (engine or {}).get("quantization")
    return f" against the target served as {quantization}" if quantization else ""


def print_table(report: AcceptanceReport, console=None) -> None:
    """Rows: all prompts, then each source. Columns: acceptance, per-position rates, speed."""
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console(stderr=True)
        if not console.is_terminal:  # logs and pipes: wide enough for K=7 without squeezing
            console = Console(stderr=True, width=140)
    k = report.num_draft_tokens
    table = Table(
        title=f"EAGLE-3 acceptance in vLLM (K={k}, greedy, {ENDS} {report.max_new_tokens})",
        caption=f"{report.export_dir}{_target_line(report.engine)}\nmeasured by {report.measured_by}\n"
        "the eval tok/s ratio is these engines' own; the serving speed-up: evaluate.py serving.measure=true",
    )
    table.add_column("prompts", justify="left", no_wrap=True)
    table.add_column("n", justify="right")
    table.add_column("accept len", justify="right", style="bold")
    table.add_column("95% interval", justify="right")
    for i in range(k):
        table.add_column(f"pos {i}", justify="right")
    table.add_column("tok/s with head", justify="right")
    table.add_column("tok/s without", justify="right")
    eager = "eager engines, " if report.engine.get("enforce_eager") else ""
    table.add_column(f"eval tok/s ratio ({eager}not a serving figure)", justify="right")
    table.add_column("greedy match", justify="right")
    rows = [(report.headline_key, report.overall)] + [(name, fig) for name, fig in report.by_source.items()]
    for name, fig in rows:
        rates = list(fig.per_position_acceptance_rate) + [math.nan] * (k - len(fig.per_position_acceptance_rate))
        table.add_row(
            SET_LABELS.get(name, name),
            str(fig.prompts),
            _fmt(fig.mean_acceptance_length),
            _interval(report.intervals.get(name), report),
            *[_fmt(r) for r in rates[:k]],
            _fmt(fig.tokens_per_s_with_head, 1),
            _fmt(fig.tokens_per_s_without_head, 1),
            _fmt(fig.eval_engines_tok_s_ratio, 2),
            _fmt(fig.greedy_match_rate, 2),
        )
    console.print(table)
    if any(c["prompts"] for c in report.by_category.values()):
        console.print(category_table(report))
    replay, val = report.train_side_replay, report.by_source.get("val")
    if replay and val is not None:
        replay_rates = " / ".join(f"{replay.get(f'replay_acc_pos{i}', math.nan):.3f}" for i in range(k))
        console.print(
            f"train-side replay of the same {int(replay['samples'])} val prompts (the dataset's answers, "
            f"serving's rounds): [bold]{replay['replay_accept_len']:.3f}[/] ({replay_rates}) vs vLLM "
            f"{_fmt(val.mean_acceptance_length)}; uniform estimate {replay[f'sim_accept_len_k{k}']:.3f}"
        )
    for source, served in report.served_replay.items():
        vllm = report.overall if source == "all" else report.by_source.get(source)
        if vllm is not None:
            console.print(
                f"replay of vLLM's own with-head outputs ({source}, {int(served['samples'])} prompts, same "
                f"tokens): [bold]{served['replay_accept_len']:.3f}[/] vs vLLM {_fmt(vllm.mean_acceptance_length)}"
            )
    if report.no_interval_reason is not None:
        console.print(f"[yellow]95% intervals {NOT_AVAILABLE}[/]: {report.no_interval_reason}")
    elif report.figures_source is not None:
        console.print(f"95% intervals over prompts: {report.figures_source}")
    for note in report.prompt_notes:
        console.print(f"[yellow]note[/]: {note}")
    for v in report.mismatch_verdicts:
        console.print(f"[{'yellow' if v['near_tie'] else 'red'}]greedy mismatch[/]: {v['description']}")
    for problem in report.consistency_problems:
        console.print(f"[red]counter check failed[/]: {problem}")
