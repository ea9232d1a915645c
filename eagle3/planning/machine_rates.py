"""Rates measured on this machine by earlier budgeted runs: what a time budget plans from, before
the table of eagle3/planning/rates.yaml.

rates.yaml holds figures measured once, on one card of a kind, with the code of that day. Another
card (an H100 where an H200 was measured), a faster step path or another data mix runs at other
rates, and a budget planned from the table spends the difference on whatever the plan left
elastic: with training the last stage, a machine that trains twice as fast re-reads the same
data twice as often. So every budgeted run records what it measured here, and the next budget on
the same machine plans from that (``time_budget.rates=machine``):

- extract.py: regeneration (new tokens/s, the engine's start left out, and that start) and capture
  (tokens/s, shards written);
- train.py: its fit (tokens/s over the whole fit, validations included: what the budget pays per
  token) and its start-up, and the acceptance evaluation's seconds.

Each figure is keyed by the machine (accelerator name, device count) and by the settings that set
its speed (``signature``: the target, the backend, the storage format, the head's shape, the batch,
the precision), so a figure is reused only for a run that would run at it. The file is
``paths.machine_rates`` (``<paths.cache_dir>/machine_rates.json``), one latest value per key, written
whole (temp + rename) under a lock. A figure the file lacks comes from the table.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import warnings
from pathlib import Path
from typing import Any

from eagle3.config.choices import BudgetRates
from eagle3.config.schema import RunConfig
from eagle3.planning import cost
from eagle3.util.atomic import write_text
from eagle3.util.locks import DirLock, LockHeldError

FILE = "machine_rates.json"
SCHEMA = 1
# the figures a run records and a plan reads; each keyed by its own signature
FIGURES = ("regen_tok_s", "regen_start_s", "capture_tok_s", "train_tok_s", "start_s", "eval_s")


def machine_name(accelerator: str) -> str:
    """This machine as its rates depend on it: the GPU's name and count, or the CPU's model and cores."""
    if str(accelerator) == "gpu":
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    return f"{_cpu_model()} ({os.cpu_count()} cores)"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def signature(cfg: RunConfig, figure: str) -> str:
    """The settings ``figure`` depends on, as one string: a recorded figure serves a run of equal signature."""
    m, d, c, h, t, topo = cfg.model, cfg.data, cfg.capture, cfg.head, cfg.train, cfg.topology
    target = f"{m.name}|{m.num_layers}x{m.hidden_size}|v{m.vocab_size}|{topo.extract_tp}tp{topo.extract_dp}dp"
    if figure in ("regen_tok_s", "regen_start_s"):
        return f"{target}|regen={d.regen_backend.value}|batch={d.regen_batch_size}|max_new={d.regen_max_tokens}"
    if figure == "capture_tok_s":
        return f"{target}|capture={c.backend.value}|{c.storage}|topk={c.teacher_topk}|len={d.max_length}"
    if figure == "train_tok_s":
        # the on-policy step walks the head's own rounds too: another rate
        onpolicy = "|onpolicy" if t.onpolicy_weight > 0 else ""
        return (
            f"{target}|head={h.intermediate_size}x{h.num_draft_layers}|v{h.draft_vocab_size}|ttt={t.ttt_steps}"
            f"|batch={t.max_tokens_per_batch}|val_every={t.val_check_interval}|{topo.precision}"
            f"|{topo.devices}x{topo.num_nodes}|{t.hidden_states.value}{onpolicy}"
        )
    if figure == "eval_s":
        e = cfg.eval
        return f"{target}|eval={e.suite_prompts},{e.math_prompts},{e.humaneval_prompts},{e.max_prompts}|new={e.max_new_tokens}"
    if figure == "start_s":
        return target
    raise ValueError(f"machine rates: unknown figure {figure!r}, expected one of {FIGURES}")


def rates_file(cfg: RunConfig) -> Path:
    return Path(cfg.paths.machine_rates)


def read(path: Path) -> dict[str, Any]:
    """The recorded figures ({machine: {figure: {signature: value}}}); {} when there is no file or it is
    unreadable (a plan then uses the table: a damaged record costs accuracy, never the run)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return {}
    machines = data.get("machines")
    return machines if isinstance(machines, dict) else {}


def recorded(cfg: RunConfig) -> dict[str, float]:
    """This machine's figures for cfg's settings (only those recorded)."""
    figures = read(rates_file(cfg)).get(machine_name(str(cfg.topology.accelerator)), {})
    out = {}
    for figure in FIGURES:
        value = figures.get(figure, {}).get(signature(cfg, figure))
        if isinstance(value, (int, float)) and value > 0:
            out[figure] = float(value)
    return out


def record(cfg: RunConfig, measured: dict[str, float | None]) -> Path | None:
    """Add ``measured`` (figure -> value; None and non-positive values skipped) to this machine's record."""
    values = {k: float(v) for k, v in measured.items() if v is not None and v > 0}
    unknown = set(values) - set(FIGURES)
    if unknown:
        raise ValueError(f"machine rates: unknown figures {sorted(unknown)}, expected some of {FIGURES}")
    if not values:
        return None
    path = rates_file(cfg)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with DirLock(path.with_name(path.name + ".lock"), f"{path}: another run is recording its rates", wait_s=60):
            machines = read(path)
            figures = machines.setdefault(machine_name(str(cfg.topology.accelerator)), {})
            for figure, value in values.items():
                figures.setdefault(figure, {})[signature(cfg, figure)] = round(value, 3)
            write_text(path, json.dumps({"schema": SCHEMA, "machines": machines}, indent=1, sort_keys=True))
    except (OSError, LockHeldError) as e:  # a record is advice for the next plan: never this run's failure
        warnings.warn(f"machine rates not recorded in {path}: {e}", stacklevel=2)
        return None
    return path


def applied(cfg: RunConfig, rates: cost.RunRates) -> cost.RunRates:
    """``rates`` with this machine's recorded figures in place of the table's, when
    ``time_budget.rates=machine``; the basis line says which figures came from where."""
    if cfg.time_budget.rates != BudgetRates.machine or rates.measured is None:
        return rates
    mine = recorded(cfg)
    if not mine:
        return dataclasses.replace(
            rates,
            basis=rates.basis
            + f"\n  (time_budget.rates=machine: nothing recorded yet for this machine in {rates_file(cfg)})",
        )
    rate = rates.measured
    per_rate: dict[str, Any] = {k: mine[k] for k in ("regen_tok_s", "regen_start_s", "start_s") if k in mine}
    if "eval_s" in mine:
        per_rate.update(eval_s=mine["eval_s"], eval_amx_s=mine["eval_s"])
    named = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(mine.items()))
    return dataclasses.replace(
        rates,
        measured=dataclasses.replace(rate, **per_rate),
        capture_tok_s=mine.get("capture_tok_s", rates.capture_tok_s),
        train_tok_s=mine.get("train_tok_s", rates.train_tok_s),
        basis=f"  (rates measured on this machine, {machine_name(str(cfg.topology.accelerator))}: {named}; "
        f"the rest from eagle3/planning/{cost.RATES_FILE.name})",
    )
