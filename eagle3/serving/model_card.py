"""The model card of an export: ``README.md`` with the Hub's YAML front matter, written from the
files in the export directory and nothing else, so a card never shows a figure that was not
measured for these weights.

    config.json, eagle3_meta.json   the target, the layer ids, the draft vocabulary, the K served
    eagle3_meta.json "training"     how it was trained (added at export time, from the run dir
                                    beside the checkpoint: summary.json, dataset_manifest.json,
                                    run_config.json, the checkpoint): the target's revision and
                                    weights hash, the data, the steps, the K trained with, the
                                    minutes and the machine
    acceptance.json                 vLLM's acceptance per prompt set and category (python
                                    evaluate.py), and how the answers ended (at EOS, or cut at
                                    max_new_tokens); never its engines' tok/s ratio, which is not a
                                    serving figure
    serving.json                    the advised K per load (eagle3/serving/advice.py): measured
                                    speed-ups (serving.measure=true), with the machine, load and K,
                                    or a prediction, said as such: the card's only speed-ups

train.py and ``python export.py`` write the card with every export; ``python evaluate.py``
rewrites it after each measurement it writes into the export. The ``vllm serve`` command is
serve_command.py's ``serving_lines`` (the one place that builds it), naming the export directory, or
the Hub repo when the card is rendered for ``push_to_hub`` (eagle3/serving/hub_push.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional, Sequence

from eagle3.draft.export_files import ACCEPTANCE, CARD, CONFIG
from eagle3.serving.advice import ServingAdvice, advice_for
from eagle3.serving.serve_command import read_acceptance, serving_lines
from eagle3.serving.training_record import META_FILE, read_json, read_record
from eagle3.target_model.quantization import ServedQuantization
from eagle3.util.atomic import write_text

CARD_FILE = CARD
TAGS = ["eagle3", "speculative-decoding", "speculators", "vllm", "draft-model"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
NOT_RECORDED = "not recorded"
LOCAL_TARGET = "<path to the target>"  # the Hub card's name for a target known here only by its path
LOCAL_EXPORT = "<this repo, downloaded>"  # the Hub card's name for the export directory


# ------------------------------------------------------------ the card


def write_card(export_dir: str | Path, model_ref: str | None = None, target_dir: str | Path | None = None) -> Path:
    """README.md in the export (whole or absent: util.atomic), from the files beside it."""
    path = Path(export_dir) / CARD_FILE
    write_text(path, card_text(export_dir, model_ref, target_dir))
    return path


def card_text(export_dir: str | Path, model_ref: str | None = None, target_dir: str | Path | None = None) -> str:
    """The card; ``model_ref``: what the serve command names as the head (default: the export
    directory; a Hub repo id for the card that is pushed, which then names no local path: the
    target by its Hub id, else as LOCAL_TARGET with its architecture). ``target_dir``: the target's
    local copy, for the size class of a predicted advice where serving.json holds none yet (advice_for)."""
    export_dir = Path(export_dir)
    config = json.loads((export_dir / CONFIG).read_text())
    meta = read_json(export_dir / META_FILE) or {}
    record = read_record(export_dir)
    acceptance = read_acceptance(export_dir / ACCEPTANCE)
    local = str(config["speculators_config"]["verifier"]["name_or_path"])
    hub_target = hub_id(local, record)
    advice = advice_for(export_dir, acceptance, target_dir=target_dir or local)
    target, here = local, str(export_dir)
    if model_ref is not None:  # the Hub's card: the target as the Hub knows it, no path of this machine
        architectures = ", ".join(config["speculators_config"]["verifier"].get("architectures") or [])
        target = hub_target or f"{LOCAL_TARGET}" + (f" ({architectures})" if architectures else "")
        here = LOCAL_EXPORT
    parts = [
        _front_matter(hub_target),
        f"# EAGLE-3 draft head for {hub_target or target}\n\n"
        "A speculative-decoding draft head in the speculators eagle3 format: vLLM runs it beside the target, "
        "it proposes the next tokens from three of the target's hidden layers and the target checks them in one "
        "forward pass (the output is the target's own). Trained and exported by eagle3; every figure below was "
        "measured for these weights and comes from the files in this folder.",
        _serve_section(export_dir, model_ref, config, meta, advice, hub_target),
        _head_section(config, target, hub_target, record, meta),
        _data_section(record),
        _run_section(record),
        _acceptance_section(acceptance, here),
        _serving_section(advice, here),
        _files_section(export_dir),
    ]
    return "\n\n".join(p.strip() for p in parts) + "\n"


def hub_id(target: str, record: dict[str, Any]) -> Optional[str]:
    """The target as the Hub knows it: the name the export gives it when that is a Hub id, else the
    model's hub_id the training recorded; None for a local directory only."""
    if _HUB_ID.fullmatch(target) and not target.startswith(".") and not Path(target).expanduser().exists():
        return target
    hub_id = (record.get("target") or {}).get("hub_id")
    return str(hub_id) if hub_id and _HUB_ID.fullmatch(str(hub_id)) else None


def _front_matter(hub_target: Optional[str]) -> str:
    """The Hub's metadata block, rendered by huggingface_hub itself (what the Hub parses)."""
    from huggingface_hub import ModelCardData

    data = ModelCardData(
        library_name="speculators", base_model=hub_target, pipeline_tag="text-generation", tags=list(TAGS)
    )
    return f"---\n{data.to_yaml()}\n---"


def _serve_section(
    export_dir: Path,
    model_ref: str | None,
    config: dict,
    meta: dict,
    advice: Optional[ServingAdvice],
    hub_target: Optional[str],
) -> str:
    spec = config["speculators_config"]
    local = str(spec["verifier"]["name_or_path"])
    lines = serving_lines(
        model_ref or export_dir,
        local if model_ref is None else hub_target or LOCAL_TARGET,
        int(spec["proposal_methods"][0]["speculative_tokens"]),
        advice,
        tensor_parallel_size=int(meta.get("serve_tensor_parallel_size", 1)),
        trust_remote_code=bool(meta.get("serve_trust_remote_code", False)),
        quantization=meta.get("serve_quantization"),
    )
    # only the command: serving_lines' advice lines may carry predicted speed-ups, which the
    # serving section below keeps apart from the measured ones
    first = lines[0].removeprefix("serve it: ")
    alone, _, with_head = first.partition(" (with the head: ")
    out = ["## Serve it with vLLM", "", "```bash", alone if not with_head else with_head.removesuffix(")"), "```"]
    if with_head:
        out += ["", f"At the lowest load the serving advice below is the target alone: `{alone}`."]
    return "\n".join(out)


def _head_section(config: dict, target: str, hub_target: Optional[str], record: dict[str, Any], meta: dict) -> str:
    layer = config.get("transformer_layer_config") or {}
    t = record.get("target") or {}
    weights = t.get("weights") or {}
    revision = t.get("revision") or (
        "; ".join(f"{name} {sha}" for name, sha in weights.items()) + " (weights by sampled sha256)"
        if weights
        else None
    )
    rows = [
        ("target", f"`{target}`" + (f" (Hub: `{hub_target}`)" if hub_target and hub_target != target else "")),
        ("served target", served_target_line(meta)),
        ("target revision or weights hash", revision or NOT_RECORDED),
        ("target architectures", ", ".join(config["speculators_config"]["verifier"].get("architectures") or []) or "-"),
        ("aux layer ids (vLLM numbering)", str(config.get("eagle_aux_hidden_state_layer_ids"))),
        ("draft vocabulary", f"{config.get('draft_vocab_size')} of {layer.get('vocab_size')} target tokens"),
        ("draft layers", str(layer.get("num_hidden_layers", 1))),
        ("hidden size", str(layer.get("hidden_size"))),
        ("trained draft tokens (K)", str((record.get("run") or {}).get("num_draft_tokens") or NOT_RECORDED)),
        (
            "served draft tokens (K, config.json)",
            str(config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]),
        ),
    ]
    return "## The head\n\n" + _table(("", ""), rows)


def served_target_line(meta: dict) -> str:
    """What the target the head was trained against runs in (eagle3_meta.json "served_target")."""
    served = meta.get("served_target")
    if not isinstance(served, dict):
        return NOT_RECORDED
    return ServedQuantization(served.get("name"), served.get("source")).describe()


_ORIGIN_KEYS = ("file_name", "path", "hf_name", "hf_config", "hf_split", "content_sha")


def _origin(source: dict[str, Any]) -> str:
    """Where one source's chats came from, as its dataset's identity names them."""
    origin = ", ".join(f"{k}: `{source[k]}`" for k in _ORIGIN_KEYS if source.get(k))
    return f"{source.get('source', NOT_RECORDED)}" + (f" ({origin})" if origin else "")


def _sources(data: dict[str, Any]) -> str:
    """The one source, or each source of a data.mixture with its weight and samples."""
    if not data.get("mixture"):
        return _origin(data)
    counts = data.get("mixture_counts") or {}
    parts = []
    for source in data["mixture"]:
        n = counts.get(source.get("name")) or {}
        held = f", {n.get('samples')} samples ({n.get('val')} held out)" if n else ""
        parts.append(f"{source.get('name')}: {_origin(source)}, weight {source.get('weight', 1.0)}{held}")
    return "; ".join(parts)


def _data_section(record: dict[str, Any]) -> str:
    data = record.get("data")
    if not data:
        return f"## Training data\n\n{NOT_RECORDED} (the export was made from a checkpoint without its run dir)."
    if data.get("regenerate"):
        engine = f" by {data['regen_engine']}" if data.get("regen_engine") else ""
        answers = f"regenerated by the target{engine} (temperature {data.get('regen_temperature', 0.0)})"
    else:
        answers = "as in the chat data (not regenerated by the target)"
    rows = [
        ("sources", _sources(data)),
        ("samples", f"{data.get('samples')} ({data.get('val_samples')} of them held out for validation)"),
        ("tokens", f"{data.get('tokens')} ({data.get('loss_tokens')} of them answer tokens, where the loss counts)"),
        ("answers", answers),
        ("max length", str(data.get("max_length", NOT_RECORDED))),
        ("hidden states", f"{data.get('hidden_states') or 'offline'} (dataset `{data.get('dataset')}`)"),
    ]
    return "## Training data\n\n" + _table(("", ""), rows)


def _machine(machine: dict[str, Any]) -> str:
    if not machine:
        return NOT_RECORDED
    cores = f", {machine.get('cpu_count')} cores" if machine.get("accelerator") == "cpu" else ""
    nodes = f" on each of {machine.get('num_nodes')} nodes" if int(machine.get("num_nodes") or 1) > 1 else ""
    return (
        f"{machine.get('devices')} x {machine.get('device_name')} ({machine.get('accelerator')}{cores}){nodes}, "
        f"torch {machine.get('torch')}"
    )


def _run_section(record: dict[str, Any]) -> str:
    run = record.get("run")
    if not run:
        return f"## Training run\n\n{NOT_RECORDED} (the export was made from a checkpoint without its run dir)."
    seconds, best, step = run.get("fit_seconds"), run.get("best_metric_value"), run.get("checkpoint_step")
    rows = [
        ("steps", f"{run.get('global_step')}"),
        ("exported checkpoint", f"`{run.get('checkpoint')}`, at step {step if step is not None else NOT_RECORDED}"),
        ("training minutes", f"{seconds / 60:.1f}" if seconds is not None else NOT_RECORDED),
        ("machine", _machine(run.get("machine") or {})),
        (
            f"best {run.get('best_metric')} (train side, not vLLM)",
            f"{best:.3f}" if isinstance(best, (int, float)) else NOT_RECORDED,
        ),
    ]
    return "## Training run\n\n" + _table(("", ""), rows)


def _ended(per_prompt: list[dict[str, Any]], max_new_tokens: int) -> tuple[int, int]:
    """(answers that ended at EOS or a stop token, answers cut at max_new_tokens). A
    ``finish_reason`` where the report records one; else by length (an answer of exactly
    max_new_tokens counts as cut)."""
    natural = cut = 0
    for p in per_prompt:
        reason = p.get("finish_reason")
        if reason is None:
            reason = "length" if int(p.get("output_tokens", 0)) >= max_new_tokens else "stop"
        natural += reason == "stop"
        cut += reason == "length"
    return natural, cut


def _fmt(x: Any, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "-"


def _interval(interval: Any) -> str:
    """A bootstrap interval of the acceptance length (eagle3/evaluation/intervals.py), "n/a" where
    acceptance.json says so (vLLM gave no per-request figures), else "-"."""
    if isinstance(interval, str):
        return interval
    bounds = interval.get("mean_acceptance_length") if isinstance(interval, dict) else None
    if not bounds or len(bounds) != 2:
        return "-"
    return f"{_fmt(bounds[0])}-{_fmt(bounds[1])} ({float(interval.get('level', 0.95)):.0%})"


def _acceptance_rows(acceptance: dict[str, Any], cap: int) -> list[tuple[str, ...]]:
    """The headline (the sets acceptance.json pools; every prompt in a report without one), then
    each prompt set, under the labels the report gives them."""
    per_prompt = acceptance.get("per_prompt") or []
    headline = acceptance.get("headline") or {}
    pooled = set(headline.get("sets") or [])
    labels = acceptance.get("set_labels") or {}
    intervals = acceptance.get("intervals") or {}
    sets = [(headline.get("label") or "all prompts", acceptance, pooled, acceptance.get("interval"))]
    sets += [(labels.get(n, n), fig, {n}, intervals.get(n)) for n, fig in (acceptance.get("by_source") or {}).items()]
    rows: list[tuple[str, ...]] = []
    for label, fig, names, interval in sets:
        prompts = [p for p in per_prompt if not names or p.get("source") in names]
        natural, cut = _ended(prompts, cap)
        rows.append(
            (
                label,
                str(fig.get("prompts") if isinstance(fig.get("prompts"), int) else len(prompts)),
                f"**{_fmt(fig.get('mean_acceptance_length'))}**",
                _interval(interval),
                " / ".join(_fmt(r, 2) for r in fig.get("per_position_acceptance_rate") or []),
                str(natural),
                str(cut),
            )
        )
    return rows


def _acceptance_section(acceptance: Optional[dict[str, Any]], export_dir: str) -> str:
    if acceptance is None:
        return (
            "## Acceptance in vLLM\n\nNot measured yet for these weights. Measure it with "
            f"`python evaluate.py export_dir={export_dir}` (it rewrites this card)."
        )
    k, cap = acceptance.get("num_draft_tokens"), int(acceptance.get("max_new_tokens") or 0)
    engine = acceptance.get("engine") or {}
    head = ("prompts", "n", "mean acceptance length", "interval", "per position", "ended at EOS", f"cut at {cap}")
    text = (
        f"## Acceptance in vLLM\n\nMeasured by {acceptance.get('measured_by', 'vLLM')} with K = {k} draft tokens, "
        f"answers: {acceptance.get('ends', 'greedy')}, max_new_tokens = {cap}; vLLM "
        f"{engine.get('vllm_version', '?')} on {engine.get('platform', '?')} (`acceptance.json`). The mean "
        "acceptance length is the tokens each target step emits (1 + accepted drafts). What it buys in tokens/s "
        "is the serving section's to say (this measurement's engines are not run as a server runs them)."
        + _interval_note(acceptance)
        + "\n\n"
        + _table(head, _acceptance_rows(acceptance, cap))
    )
    categories = acceptance.get("by_category") or {}
    if categories:
        rows = [
            (name, str(c.get("prompts")), _fmt(c.get("mean_acceptance_length")), _interval(c.get("interval")))
            for name, c in categories.items()
        ]
        text += "\n\nPer category:\n\n" + _table(("category", "n", "mean acceptance length", "interval"), rows)
    return text


def _interval_note(acceptance: dict[str, Any]) -> str:
    """Why the intervals are n/a, where acceptance.json says they are."""
    method = str(acceptance.get("interval_method") or "")
    return f" Intervals: {method}." if method.startswith("n/a") else ""


def _measured(advice: ServingAdvice, load: Any) -> bool:
    """Whether the advice at this load was measured (a load's own ``basis`` where serving.json
    records one: a measured advice may fill loads it did not measure with the rule)."""
    basis = getattr(load, "basis", "")
    return basis == "measured" if basis else advice.source == "measured"


def _serving_section(advice: Optional[ServingAdvice], export_dir: str) -> str:
    title = "## Serving speed-up"
    how = f"`python evaluate.py export_dir={export_dir} serving.measure=true`"
    measured = [a for a in sorted(advice.loads, key=lambda a: a.load) if _measured(advice, a)] if advice else []
    predicted = [a for a in sorted(advice.loads, key=lambda a: a.load) if not _measured(advice, a)] if advice else []
    text = title + "\n\n"
    if measured:
        assert advice is not None
        device = advice.inputs.get("device")
        answers = advice.inputs.get("speedups_from")
        rows = [(str(a.load), str(a.num_speculative_tokens or "none"), f"{a.speedup:.2f}x") for a in measured]
        text += (
            f"Measured by {how}" + (f" on {device}" if device else "") + (f", {answers}" if answers else "")
            + " (`serving.json`): per load (concurrent requests) the best K and its tokens/s over the target "
            "alone's; `none`: no K beat the target alone there.\n\n" + _table(("load", "K", "speed-up"), rows)
        )  # fmt: skip
    else:
        text += f"Not measured yet for these weights ({how} measures it)."
    if predicted:
        assert advice is not None
        inputs = advice.inputs.get("rule_inputs") or advice.inputs
        per_load = "; ".join(
            f"{a.load}: K={a.num_speculative_tokens}" if a.num_speculative_tokens else f"{a.load}: none"
            for a in predicted
        )
        basis = f" ({inputs['acceptance']})" if inputs.get("acceptance") else ""
        text += (
            f"\n\nPredicted, not measured{' at the other loads' if measured else ''}: the advised K per load from "
            f"the acceptance above{basis} and the step costs measured on another target of the "
            f"{inputs.get('step_costs_class', 'nearest')} class: {per_load} (`none`: serve the target alone)."
        )
    return text


def _files_section(export_dir: Path) -> str:
    names = sorted(p.name for p in export_dir.iterdir() if p.is_file() and not p.name.startswith("."))
    names = sorted(set(names) | {CARD_FILE})
    return "## Files\n\n" + ", ".join(f"`{n}`" for n in names)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([row(head), "|" + "---|" * len(head), *(row(r) for r in rows)])
