"""polish.py's stage: rounds of on-policy training from a head that exists (train.init_from).

The head's architecture is the start head's: every round is composed with the head.* and
layers.aux_ids values its config.json states (eagle3/training/init_from.py head_overrides:
draft vocabulary, layers, attention and MLP sizes, norm flags, aux layer ids), whatever the head
group or the command line says (one line names them, and where the head won); the target's sizes
must still fit it (check_compatible).

Each round, from the last round's export (the first from train.init_from):
  1. new prompts (the data group's; experiment=smollm2_polish: prompts the target writes itself,
     data.seed + the round's number drawing new ones each round, never the held-out suite) are
     answered greedily by the target and its states captured over them: extract.py's stage on a
     config composed for the round (data.max_samples = polish.prompts_per_round,
     data.regenerate=true), so the round's dataset has its own fingerprint;
  2. train.py's stage trains from the current head (train.init_from) for polish.steps_per_round
     steps (with polish.minutes: for what the round's share leaves, below) with the on-policy
     objective mixed into the supervised loss (train.onpolicy_weight: the rounds of the head as
     it is now, eagle3/draft/onpolicy.py), exports it and, with polish.eval_rounds, measures it
     in vLLM: each round is a train.py run in <run dir>/round-<n>/, resumed from its own
     checkpoints like any train.py run;
  3. the round's record goes into <run dir>/polish_state.json (eagle3/stages/polish_state.py)
     and a line is printed: round i/n, its tokens/s, its acceptance.
With polish.minutes each round is a time budget of its own (eagle3/planning/time_budget.py): the
minutes not yet spent, shared evenly by the rounds not yet run, become the round's
time_budget.minutes, so its answering and capture stop at their shares' ends (polish.prompts_per_round
the most it answers) and its training gets the rest; without that a round answering more prompts
than the minutes hold spends them all before its first step.
A rerun of the same command continues after the last finished round. At the end vLLM measures
the start head and the polished one on the same prompts (the held-out suite and the first
round's validation split), into summary.json, with every round's figures.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from eagle3.config.errors import ConfigError
from eagle3.config.polish import PolishConfig
from eagle3.config.schema import RunConfig, run_config
from eagle3.planning.time_budget import FixedCostsPastBudget, time_shares
from eagle3.stages.polish_log import log_round
from eagle3.stages.polish_state import PolishState, RoundRecord, load_state
from eagle3.stages.validate import validate_run_config
from eagle3.store import Manifest
from eagle3.target_model.hub import resolve_model_dir
from eagle3.target_model.resolve import resolve_target
from eagle3.training.init_from import head_overrides, read_head_config
from eagle3.training.run_dir import run_dir_lock
from eagle3.util.atomic import write_text
from eagle3.util.report import say


def run(composed: DictConfig) -> float:
    """``composed``: polish.py's config (conf/polish.yaml); returns the polished head's acceptance
    length in vLLM (its last round's train-side replay where vLLM did not measure it)."""
    validate_run_config(composed)
    polish = _polish_config(composed)
    start = composed.train.init_from
    if not start:
        raise ConfigError("train.init_from: expected the head to polish (an export directory or a hub id), got null")
    say([_architecture_line(composed, start_architecture(composed))])
    run_dir = Path(composed.paths.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with run_dir_lock(run_dir):
        state = load_state(run_dir, str(start))
        if state.rounds:
            say([f"polish: {len(state.rounds)} of {polish.rounds} rounds done in {run_dir}; continuing"])
        _rounds(composed, polish, state, run_dir)
        if not state.rounds:
            raise ConfigError(f"polish.minutes={polish.minutes}: no round fitted in the minutes; nothing polished")
        summary = _summary(composed, polish, state, run_dir)
        write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
        say([f"summary: {run_dir / 'summary.json'}", _gain_line(summary), state.head])
        return _polished_figure(summary)


def _polish_config(composed: DictConfig) -> PolishConfig:
    polish: PolishConfig = OmegaConf.to_object(composed.polish)  # type: ignore[assignment]
    for key in ("rounds", "prompts_per_round"):
        if int(getattr(polish, key)) < 1:
            raise ConfigError(f"polish.{key}: expected >= 1, got {getattr(polish, key)}")
    if polish.steps_per_round < 0:
        raise ConfigError(f"polish.steps_per_round: expected >= 0, got {polish.steps_per_round}")
    if polish.minutes is not None and polish.minutes <= 0:
        raise ConfigError(f"polish.minutes: expected > 0 or null, got {polish.minutes}")
    return polish


def _rounds(composed: DictConfig, polish: PolishConfig, state: PolishState, run_dir: Path) -> None:
    """The rounds not yet finished, each recorded in the state file as it ends."""
    for number in range(len(state.rounds) + 1, polish.rounds + 1):
        if polish.minutes is not None and state.seconds >= polish.minutes * 60:
            say([f"polish: polish.minutes={polish.minutes:g} spent after {len(state.rounds)} rounds; stopping"])
            return
        began = time.monotonic()
        minutes = round_minutes(polish, number, state.seconds)
        round_cfg = round_config(composed, polish, number, state.head, run_dir, minutes)
        if minutes is not None and not _round_fits(round_cfg, polish, number, bool(state.rounds)):
            return
        record = _one_round(round_cfg, number, began)
        state.add(record, run_dir)
        say([_round_line(record, polish.rounds, state)])
        log_round(run_config(round_cfg).logger, run_dir, record)


def round_minutes(polish: PolishConfig, number: int, spent_s: float) -> float | None:
    """Round ``number``'s time budget: the polish.minutes not yet spent (``spent_s``: the finished
    rounds'), shared evenly by this round and those after it; None without polish.minutes. A rerun
    after a killed round gives it the same minutes (only finished rounds are spent), so it finds
    the dataset it was answering."""
    if polish.minutes is None:
        return None
    return (polish.minutes * 60.0 - spent_s) / 60.0 / (polish.rounds - number + 1)


def _round_fits(round_cfg: DictConfig, polish: PolishConfig, number: int, any_done: bool) -> bool:
    """Whether round ``number``'s minutes hold its fixed costs (stage starts, the answering engine's
    start, the export; eagle3/planning/time_budget.py): when they do not, the polish stops after the
    rounds it has, or refuses with none."""
    try:
        time_shares(run_config(round_cfg))
    except FixedCostsPastBudget as e:
        why = f"polish.minutes={polish.minutes:g}: round {number} gets {round_cfg.time_budget.minutes:.2f} min: {e}"
        if not any_done:
            raise ConfigError(why + " (more polish.minutes, or fewer polish.rounds)") from e
        say([f"polish: {why}; stopping after {number - 1} rounds"])
        return False
    return True


def start_architecture(composed: DictConfig) -> dict[str, Any]:
    """The head's architecture as config keys (head.*, layers.aux_ids, layers.numbering), read from
    the start head's config.json (train.init_from): continuing to train a head cannot change it."""
    return head_overrides(read_head_config(str(composed.train.init_from), composed.train.init_from_revision))


def _architecture_line(composed: DictConfig, architecture: dict[str, Any]) -> str:
    """Which values the rounds take from the start head, with this config's where the head's differ."""
    shown = []
    for key, value in architecture.items():
        if key == "layers.numbering":
            continue
        ours = _configured(composed, key)
        shown.append(f"{key}={_show(value)}" + ("" if ours == value else f" (this config: {_show(ours)})"))
    return f"polish: from the start head's config.json (train.init_from={composed.train.init_from}): " + ", ".join(
        shown
    )


def _configured(composed: DictConfig, key: str) -> Any:
    """``key``'s value as this config would build the head (a null size: the target's)."""
    if key == "layers.aux_ids":
        return [int(i) for i in composed.layers.aux_layer_ids]
    name = key.removeprefix("head.")
    value = composed.head[name]
    model = composed.model
    if name == "draft_vocab_size" and model.vocab_size is not None:
        return min(int(value), int(model.vocab_size))  # as the head is built (training/builder.py)
    if value is None and name in ("num_attention_heads", "intermediate_size"):
        return model[name]
    if value is None and name == "num_key_value_heads":
        return model.num_key_value_heads or model.num_attention_heads
    return value


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return "the target's" if value is None else str(value)


def round_config(
    composed: DictConfig, polish: PolishConfig, number: int, head: str, run_dir: Path, minutes: float | None = None
) -> DictConfig:
    """train.py's config of round ``number``: its own prompts and run dir, the head it starts from,
    the start head's architecture (start_architecture: over the head group's and the command line's);
    ``minutes``: its time budget (round_minutes), None: the round's sizes alone."""
    raw: Any = OmegaConf.to_container(composed, resolve=False)
    raw.pop("polish")
    for key, value in start_architecture(composed).items():
        group, name = key.split(".")
        raw[group][name] = value
    raw["train"]["init_from"] = head
    if number > 1:  # the revision names the start's hub commit, not a round's export
        raw["train"]["init_from_revision"] = None
    raw["train"]["max_steps"] = polish.steps_per_round
    raw["data"]["max_samples"] = polish.prompts_per_round
    raw["data"]["seed"] = int(composed.data.seed) + number
    raw["data"]["regenerate"] = True  # the target's greedy answers: what the rounds are walked on
    raw["time_budget"]["minutes"] = minutes  # the round's share of polish.minutes, not the data group's budget
    raw["eval"]["enabled"] = bool(composed.eval.enabled) and polish.eval_rounds
    raw["paths"]["output_dir"] = str(run_dir / f"round-{number}")
    return OmegaConf.merge(OmegaConf.structured(RunConfig), raw)  # type: ignore[return-value]


def _one_round(round_cfg: DictConfig, number: int, began: float) -> RoundRecord:
    """Round ``number``: answer and capture, then train (under the round's time budget, when it has one)."""
    from eagle3.stages.extract import run as extract  # the stages, loaded when a round runs
    from eagle3.stages.train import run as train

    dataset_dir = extract(round_cfg)
    train(round_cfg)
    summary = json.loads((Path(round_cfg.paths.output_dir) / "summary.json").read_text())
    final = summary.get("final") or {}
    k = int(round_cfg.eval.num_draft_tokens)
    return RoundRecord(
        round=number,
        export_dir=str(summary["export_dir"]),
        dataset_dir=str(dataset_dir),
        seconds=round(time.monotonic() - began, 1),
        tokens=int(Manifest.read(Path(dataset_dir)).num_tokens),
        steps=int(summary["global_step"]),
        train_tok_s=(summary.get("fit") or {}).get("tok_s"),
        replay_accept_len=final.get("val/replay_accept_len"),
        replay_acc_pos=[final[f"val/replay_acc_pos{i}"] for i in range(k) if f"val/replay_acc_pos{i}" in final],
        served=_served(summary.get("acceptance")),
    )


def _served(acceptance: dict | None) -> dict[str, Any] | None:
    """vLLM's figures from an evaluation's result (evaluate_trained): the acceptance length, the
    rate per draft position (from its acceptance.json); None when it did not measure."""
    if not acceptance or "mean_acceptance_length" not in acceptance:
        return None
    report = json.loads(Path(acceptance["json"]).read_text())
    return {
        "mean_acceptance_length": acceptance["mean_acceptance_length"],
        "per_position_acceptance_rate": report.get("per_position_acceptance_rate"),
        "json": acceptance["json"],
    }


def _round_line(record: RoundRecord, rounds: int, state: PolishState) -> str:
    tok_s = f"{record.train_tok_s:,.0f} tokens/s" if record.train_tok_s else "no fit"
    replay = f"{record.replay_accept_len:.3f}" if record.replay_accept_len is not None else "n/a"
    served = f", vLLM {record.served['mean_acceptance_length']:.3f}" if record.served else ""
    return (
        f"polish round {record.round}/{rounds}: {record.tokens:,} tokens, {record.steps} steps at {tok_s}, "
        f"{record.seconds:.0f} s (polish so far {state.seconds:.0f} s); acceptance length: replay {replay}{served}"
    )


def _summary(composed: DictConfig, polish: PolishConfig, state: PolishState, run_dir: Path) -> dict[str, Any]:
    """summary.json: the rounds, and vLLM's acceptance of the start head against the polished one
    on the same prompts (the held-out suite and the first round's validation split)."""
    last = run_config(round_config(composed, polish, len(state.rounds), state.head, run_dir))
    # eval.enabled as asked (a round's config turns it off under polish.eval_rounds=false)
    last = dataclasses.replace(last, eval=dataclasses.replace(last.eval, enabled=bool(composed.eval.enabled)))
    acceptance: dict[str, Any] = {}
    if last.eval.enabled:
        from eagle3.stages.evaluate import evaluate_trained  # the evaluate stage, loaded only here

        target_dir = resolve_target(last.model, last.paths.cache_dir)
        prompts = Path(state.rounds[0].dataset_dir)
        if state.start_acceptance is None:  # measured once: a resumed polish keeps it
            start_dir = resolve_model_dir(state.start, last.train.init_from_revision, field="train.init_from")
            measured = evaluate_trained(
                last, start_dir, prompts, target_dir, None, out_dir=run_dir / "eval-start", baseline=False
            )
            state.start_acceptance = _served(measured) or measured
            state.save(run_dir)
        polished = evaluate_trained(
            last, Path(state.head), prompts, target_dir, None, out_dir=run_dir / "eval-polished"
        )
        acceptance = {"start": state.start_acceptance, "polished": _served(polished) or polished}
        acceptance["gap"] = _gap(acceptance["start"], acceptance["polished"])
    return {
        "start": state.start,
        "polished_export": state.head,
        "rounds": [vars(r) for r in state.rounds],
        "seconds": state.seconds,
        "acceptance": acceptance,
    }


def _gap(start: dict[str, Any] | None, polished: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the polish recovered on the headline prompts: polished minus start with a paired
    interval over the prompts both were measured on (eagle3/evaluation/gap.py); None where either
    head was not measured, {"error": why} where the two reports cannot be paired."""
    from eagle3.evaluation.gap import acceptance_gap

    if not (start and polished and start.get("json") and polished.get("json")):
        return None
    reports = [json.loads(Path(m["json"]).read_text()) for m in (start, polished)]
    try:
        gap = acceptance_gap(reports[0], reports[1], names=("start", "polished"))
    except ValueError as e:  # a resumed polish whose start was measured on other prompts
        return {"error": str(e)}
    head = gap["sets"][gap["headline"]["key"]]
    keep = ("label", "prompts", "gap", "gap_interval", "relative_gap", "relative_gap_interval", "no_interval_reason")
    return {"level": gap["level"], "method": gap["method"], **{k: head[k] for k in keep}}


def _gain_line(summary: dict[str, Any]) -> str:
    acc = summary["acceptance"]
    start = (acc.get("start") or {}).get("mean_acceptance_length")
    polished = (acc.get("polished") or {}).get("mean_acceptance_length")
    if start is None or polished is None:
        return "polish: vLLM did not measure the start and the polished head (eval.enabled, or see summary.json)"
    line = f"polish: acceptance length in vLLM {start:.3f} -> {polished:.3f} ({polished - start:+.3f}"
    gap = acc.get("gap") or {}
    lo_hi = gap.get("gap_interval")
    if lo_hi:
        line += f", {gap['level']:.0%} interval {lo_hi[0]:+.3f} .. {lo_hi[1]:+.3f} over {gap['prompts']} prompts"
    elif gap.get("no_interval_reason") or gap.get("error"):
        line += ", no interval: see summary.json acceptance.gap"
    return line + ")"


def _polished_figure(summary: dict[str, Any]) -> float:
    polished = (summary["acceptance"].get("polished") or {}).get("mean_acceptance_length")
    if polished is not None:
        return float(polished)
    replay = summary["rounds"][-1]["replay_accept_len"]
    return float(replay) if replay is not None else float("nan")
