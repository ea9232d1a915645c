"""The acceptance gap between two heads measured on the same prompts, with its interval.

Two acceptance.json reports (evaluate.py's, one per head) answer "is head B better than head A,
by how much, and is it noise?" only when read together: each report's own interval says how
much its figure would move on other prompts, but two heads measured on the *same* prompts move
together (an easy prompt is easy for both), so the gap is far tighter than the two intervals
side by side suggest. ``acceptance_gap`` pairs the reports on their prompts and gives, for the
headline sets pooled, each prompt set and the validation split (in-distribution):

- each head's pooled acceptance length (1 + accepted / verify steps, intervals.pooled) and
  per-position rates, B minus A in both, and the relative gap B / A - 1;
- a paired bootstrap interval of each: ``n_boot`` resamples of the set's prompt units drawn with
  replacement, the *same* picks for both heads, each head pooled over its picks, the gap of the
  pooled figures; the interval is the central ``level`` share (percentile).

A prompt unit is intervals.Unit: one prompt's verify steps and accepted drafts per position,
its turns summed (a two-turn prompt's turns stay together, as in breakdown.py). The reports must
hold the same prompts (each turn of each), the same K and the same max_new_tokens; otherwise
the gap compares different measurements, and a ValueError names what differs. The validation
split alone may differ (each head's is drawn from its own dataset): it is then left out of the
pairing, each head's own figure there kept in ``validation_apart`` with the reason.

Without per-request figures in either report (a vLLM that gives none: every per-prompt entry
has drafts 0, or ``engine.per_request_figures`` is false) there is no per-prompt unit to
resample: the point gaps come from each set's counters (by_source), every interval is None and
``no_interval_reason`` says why and how to get them. Never a silent blank.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np

from eagle3.evaluation.breakdown import headline_key
from eagle3.evaluation.intervals import LEVEL, N_BOOT, PromptKey, Unit, pooled, prompt_key, prompt_units
from eagle3.evaluation.prompts import VAL

METHOD = (
    "paired bootstrap over prompt units (percentile): the same resampled prompts for both heads, "
    "the gap of the pooled 1 + accepted / verify steps"
)
POINT_FROM_UNITS = "per-prompt figures (the units the interval resamples)"
POINT_FROM_COUNTERS = "each set's counters (by_source)"
HOW_TO_GET_THEM = (
    "measure both heads again with per-prompt figures: a vLLM that gives per-request spec-decode figures, "
    "or eval.step_figures=true on one that does not (each request's figures from the tokens of each engine "
    "step) or eval.prompts_apart=true (from the engine counters around each prompt's own call)"
)

Key = PromptKey  # one prompt unit: (set, prompt id without its "#<turn>" suffix)


def _turns(report: dict[str, Any]) -> dict[Key, list[int]]:
    """Each prompt unit's turns, as the per-prompt entries list them."""
    turns: dict[Key, list[int]] = {}
    for p in report.get("per_prompt") or []:
        turns.setdefault(prompt_key(p["source"], p["id"]), []).append(int(p.get("turn", 1)))
    return {k: sorted(v) for k, v in turns.items()}


def _unit(drafts: int, accepted_per_position: Sequence[int], k: int) -> Unit:
    """A Unit of K positions (a list shorter than K, as a prompt without drafts has, padded with 0)."""
    per_pos = [int(x) for x in list(accepted_per_position or [])[:k]]
    return Unit(int(drafts or 0), tuple(per_pos + [0] * (k - len(per_pos))))


def _units(report: dict[str, Any], k: int) -> dict[Key, Unit]:
    """Each prompt unit's figures: its turns' verify steps and accepted drafts per position summed."""
    entries = report.get("per_prompt") or []
    return prompt_units(
        ((prompt_key(p["source"], p["id"]), p.get("drafts"), p.get("accepted_per_position")) for p in entries), k
    )


def _no_per_request_figures(report: dict[str, Any]) -> Optional[str]:
    """Why a report has no per-prompt figures, or None where it has them."""
    engine = report.get("engine") or {}
    if engine.get("per_request_figures") is False:
        version = engine.get("vllm_version")
        on = f", vLLM {version}{' on ' + engine['platform'] if engine.get('platform') else ''}" if version else ""
        return f"engine.per_request_figures is false{on}"
    if not report.get("per_prompt"):
        return "no per_prompt entries"
    if not any(p.get("drafts") for p in report["per_prompt"]):
        return "every per_prompt entry has drafts 0"
    return None


def _refusals(a: dict[str, Any], b: dict[str, Any], names: Sequence[str]) -> list[str]:
    """What makes the two reports' figures not comparable (empty: they are)."""
    na, nb = names
    problems = []
    for field in ("num_draft_tokens", "max_new_tokens"):
        if a.get(field) != b.get(field):
            problems.append(f"{field} differs: {na} {a.get(field)}, {nb} {b.get(field)}")
    sets_a, sets_b = list(a["headline"]["sets"]), list(b["headline"]["sets"])
    if sets_a != sets_b:
        problems.append(f"headline sets differ: {na} {sets_a}, {nb} {sets_b}")
    ta, tb = _turns(a), _turns(b)
    if ta or tb:
        only_a, only_b = sorted(set(ta) - set(tb)), sorted(set(tb) - set(ta))
        if only_a or only_b:

            def few(keys: list[Key]) -> str:
                shown = ", ".join(f"{s}/{i}" for s, i in keys[:5])
                return shown + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")

            problems.append(
                f"the prompts differ: {na} has {len(ta)} prompt units, {nb} {len(tb)}"
                + (f"; only in {na}: {few(only_a)}" if only_a else "")
                + (f"; only in {nb}: {few(only_b)}" if only_b else "")
            )
        turns = sorted(key for key in set(ta) & set(tb) if ta[key] != tb[key])
        if turns:
            s, i = turns[0]
            problems.append(
                f"the turns of {len(turns)} prompt(s) differ, e.g. {s}/{i}: {na} turns {ta[turns[0]]}, "
                f"{nb} turns {tb[turns[0]]}"
            )
    else:  # no per-prompt entries in either: the prompt counts per set are all there is to compare
        pa, pb = dict(a.get("prompts") or {}), dict(b.get("prompts") or {})
        if pa != pb:
            problems.append(f"the prompt counts per set differ: {na} {pa}, {nb} {pb}")
    return problems


def _head_figures(units: Sequence[Unit], k: int) -> dict[str, Any]:
    length, rates = pooled(units, k)
    return {
        "mean_acceptance_length": length,
        "per_position_acceptance_rate": rates,
        "drafts": sum(u.drafts for u in units),
    }


def _pair(
    ua: Sequence[Unit], ub: Sequence[Unit], k: int, level: float, n_boot: int, seed: int
) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """The paired bootstrap intervals of the gaps over aligned units (ua[i] and ub[i]: one prompt),
    or (None, why)."""
    # a prompt with no drafts from either head adds nothing to either pooled figure (as intervals.bootstrap)
    kept = [(x, y) for x, y in zip(ua, ub) if x.drafts or y.drafts]
    if len(kept) < 2:
        return None, f"{len(kept)} prompt(s) with drafts: under two, no spread to resample"
    n = len(kept)
    drafts = np.array([[x.drafts, y.drafts] for x, y in kept], dtype=np.float64).T  # [2 heads, n]
    accepted = (
        np.array([[x.accepted_per_position[:k], y.accepted_per_position[:k]] for x, y in kept], dtype=np.float64)
        .reshape(n, 2, k)
        .transpose(1, 0, 2)
    )  # [2 heads, n, k]
    picks = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))  # [n_boot, n]: the same for both heads
    with np.errstate(divide="ignore", invalid="ignore"):
        rates = accepted[:, picks].sum(axis=2) / drafts[:, picks].sum(axis=2)[..., None]  # [2, n_boot, k]
        length = 1.0 + rates.sum(axis=2)  # [2, n_boot]
        gap = length[1] - length[0]  # [n_boot]
        relative = length[1] / length[0] - 1.0  # [n_boot]
        position_gap = rates[1] - rates[0]  # [n_boot, k]
    # a resample whose picks hold no drafts of one head has no pooled figure (only where few prompts draft)
    ok = np.isfinite(gap) & np.isfinite(relative)  # [n_boot]
    if not ok.any():
        return None, "one head has no drafts on these prompts: no pooled figure to compare"
    tail = (1.0 - level) / 2 * 100

    def interval(x: np.ndarray) -> list[float]:  # x: [n_boot] -> [lo, hi]
        lo, hi = np.percentile(x[ok], [tail, 100 - tail])
        return [round(float(lo), 4), round(float(hi), 4)]

    return {
        "gap_interval": interval(gap),
        "relative_gap_interval": interval(relative),
        "per_position_gap_interval": [interval(position_gap[:, i]) for i in range(k)],
    }, None


def _set_gap(
    label: str,
    sets: list[str],
    prompts: int,
    fa: dict[str, Any],
    fb: dict[str, Any],
    point_from: str,
    paired: Optional[dict[str, Any]],
    why: Optional[str],
) -> dict[str, Any]:
    la, lb = fa["mean_acceptance_length"], fb["mean_acceptance_length"]
    return {
        "label": label,
        "sets": sets,
        "prompts": prompts,
        "a": fa,
        "b": fb,
        "gap": lb - la,
        "gap_interval": paired["gap_interval"] if paired else None,
        "relative_gap": lb / la - 1.0 if la and not math.isnan(la) else math.nan,
        "relative_gap_interval": paired["relative_gap_interval"] if paired else None,
        "per_position_gap": [
            y - x for x, y in zip(fa["per_position_acceptance_rate"], fb["per_position_acceptance_rate"])
        ],
        "per_position_gap_interval": paired["per_position_gap_interval"] if paired else None,
        "point_from": point_from,
        "no_interval_reason": why,
    }


def _set_names(a: dict[str, Any], b: dict[str, Any], headline: str) -> list[str]:
    """The sets to compare, in the report's order: the headline's key first, then each set of
    by_source with prompts (the validation split among them where it was measured)."""
    names = [s for s, fig in (a.get("by_source") or {}).items() if (fig or {}).get("prompts")]
    names += [s for s in sorted({p["source"] for p in a.get("per_prompt") or []}) if s not in names]
    if VAL not in names and (a.get("in_distribution") or b.get("in_distribution")):
        names.append(VAL)
    return [headline] + [s for s in names if s != headline]


def _validation_apart(
    a: dict[str, Any], b: dict[str, Any], names: Sequence[str]
) -> tuple[dict[str, Any], dict[str, Any], Optional[dict[str, Any]]]:
    """The two reports without their validation splits where those are other prompts (each head's
    split is drawn from its own dataset: two arms of an equal-minutes A/B each answer their own
    conversations), and each head's own figure there with why it is not paired; the reports as
    they are where the splits agree (or per-prompt entries are missing: nothing to tell them by)."""
    ta, tb = _turns(a), _turns(b)
    val_a, val_b = ({k for k in t if k[0] == VAL} for t in (ta, tb))
    if not (ta and tb) or val_a == val_b:
        return a, b, None

    def without_val(report: dict[str, Any]) -> dict[str, Any]:
        out = dict(report, in_distribution=None)
        out["per_prompt"] = [p for p in report.get("per_prompt") or [] if p["source"] != VAL]
        for field in ("by_source", "prompts"):
            out[field] = {s: v for s, v in (report.get(field) or {}).items() if s != VAL}
        return out

    apart = {
        "why": f"the validation splits are other prompts ({len(val_a)} and {len(val_b)} units, "
        f"{len(val_a & val_b)} shared): each head's own, not paired",
        **{name: (r.get("in_distribution") or {}).get("mean_acceptance_length") for name, r in zip(names, (a, b))},
    }
    return without_val(a), without_val(b), apart


def acceptance_gap(
    a: dict[str, Any],
    b: dict[str, Any],
    *,
    level: float = LEVEL,
    n_boot: int = N_BOOT,
    seed: int = 0,
    names: tuple[str, str] = ("A", "B"),
) -> dict[str, Any]:
    """B minus A per set (the headline pooled, each prompt set, the validation split), with paired
    bootstrap intervals where both reports have per-prompt figures; ``a`` and ``b`` are two
    acceptance.json dicts measured on the same prompts (ValueError where they are not); ``names``
    name the heads in the refusal, the reason and the result."""
    a, b, apart = _validation_apart(a, b, names)
    problems = _refusals(a, b, names)
    if problems:
        raise ValueError("the two reports are not measurements of the same prompts: " + "; ".join(problems))
    k = int(a["num_draft_tokens"])
    headline_sets = list(a["headline"]["sets"])
    headline = headline_key(headline_sets)
    labels = {**(a.get("set_labels") or {}), headline: a["headline"].get("label", headline)}
    whys = [(name, why) for name, r in zip(names, (a, b)) if (why := _no_per_request_figures(r))]
    missing = [f"{n}: {w}" for n, w in whys]
    if len(whys) == 2 and whys[0][1] == whys[1][1]:
        missing = [f"{names[0]} and {names[1]}: {whys[0][1]}"]
    reason = (
        None
        if not missing
        else f"no per-prompt figures ({'; '.join(missing)}): a paired interval resamples each prompt's own "
        f"figures from both heads; {HOW_TO_GET_THEM}"
    )

    out: dict[str, Any] = {
        "names": list(names),  # a and b of each set: the first head, then the second
        # the served target's quantization each was measured against (vLLM's name, null: the
        # checkpoint as it is): where they differ, the gap is of head and target together
        "targets": [(r.get("engine") or {}).get("quantization") for r in (a, b)],
        "num_draft_tokens": k,
        "max_new_tokens": a.get("max_new_tokens"),
        "headline": {"key": headline, "sets": headline_sets, "label": labels[headline]},
        "level": level,
        "n_boot": n_boot,
        "seed": seed,
        "method": METHOD if reason is None else f"n/a: {reason}",
        "no_interval_reason": reason,
        "sets": {},
    }
    if apart:
        out["validation_apart"] = apart
    if reason is None:
        units_a, units_b = _units(a, k), _units(b, k)
        keys = sorted(units_a)  # the same keys in both (_refusals): sorted, an entry order changes nothing
        for name in _set_names(a, b, headline):
            members = headline_sets if name == headline else [name]
            chosen = [key for key in keys if key[0] in members]
            ua, ub = [units_a[key] for key in chosen], [units_b[key] for key in chosen]
            paired, why = _pair(ua, ub, k, level, n_boot, seed)
            out["sets"][name] = _set_gap(
                labels.get(name, name), list(members), len(chosen),
                _head_figures(ua, k), _head_figures(ub, k), POINT_FROM_UNITS, paired, why,
            )  # fmt: skip
        return out

    def counters(report: dict[str, Any], sets: list[str]) -> list[Unit]:  # one unit per set: its counter totals
        by_source = report.get("by_source") or {}
        return [
            _unit(by_source[s].get("drafts"), by_source[s].get("accepted_per_position"), k)
            for s in sets
            if s in by_source
        ]

    # prompt units per set: acceptance.json's "prompts" counts a two-turn prompt once (by_source counts requests)
    units_per_set = {s: int(n) for s, n in (a.get("prompts") or {}).items()}
    for name in _set_names(a, b, headline):
        members = headline_sets if name == headline else [name]
        prompts = sum(
            units_per_set.get(s, int(((a.get("by_source") or {}).get(s) or {}).get("prompts") or 0)) for s in members
        )
        out["sets"][name] = _set_gap(
            labels.get(name, name), list(members), prompts,
            _head_figures(counters(a, members), k), _head_figures(counters(b, members), k),
            POINT_FROM_COUNTERS, None, reason,
        )  # fmt: skip
    return out
