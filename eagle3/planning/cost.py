"""What a run will cost, said before it starts: extract.py and train.py log a few lines
(printed, and written to the run's log, ``<run dir>/<task>.log``), e.g. for the CPU default:

    extract: 800 samples x <= 384 tokens = <= 307,200 tokens; disk <= 1.3 GiB; capture <= ~5.7 min at ~906 tok/s
    train: 800 steps x <= 1,024 tokens = <= 819,200 tokens (batches hold ~775 per rank: ~620,373
           tokens, ~2.2 passes over 280,719 train tokens); ~7.8 min at ~1,325 tok/s

Times divide those token counts by the rates of ``rates.yaml`` beside this file: throughputs
measured on real runs (each figure with the command that measured it), scaled to the run's
shapes where they differ from the measured ones (capture by the target's active parameters, training by
the draft's FLOPs per token, both by the devices used). They are read once per estimate or time budget
(``run_rates``) and passed down. Most were measured on a machine running nothing else: other jobs
on its cores slow a run down.
Training logs an updated ETA from its own step times once a few steps have run
(eagle3/training/callbacks.py, TrainEta).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from eagle3.config.choices import CaptureBackend
from eagle3.config.schema import RunConfig
from eagle3.planning import disk_estimate
from eagle3.planning.disk_estimate import MILLION
from eagle3.store.storage_format import StorageFormat
from eagle3.target_model.compute_dtype import compute_dtype, cpu_bf16_on_amx
from eagle3.target_model.size import preset_config, target_size
from eagle3.util.hidden_dtypes import torch_dtype
from eagle3.util.report import minutes

# rates.yaml's target shape under config.json's names; its other keys (experts, head_dim, tied
# embeddings) are config.json fields already
_TARGET_KEYS = {
    "num_layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "intermediate": "intermediate_size",
    "vocab": "vocab_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
}


def measured_params(target: Mapping[str, Any]) -> float:
    """Active parameters of a rates.yaml entry's ``target`` (eagle3.target_model.size): the size
    capture scales by and the nearest entry is chosen by."""
    return target_size({_TARGET_KEYS.get(k, k): v for k, v in target.items()}).active_params


def head_flops(hidden: int, intermediate: int | None, draft_vocab: int, ttt_steps: int, draft_layers: int = 1) -> float:
    """Matmul FLOPs per token of one training step (forward + backward) of an EAGLE-3 head:
    fc on the 3 aux layers once, then per TTT step its decoder layers (2H input) and lm_head,
    plus the frozen target lm_head's draft-vocabulary rows (forward only). Attention's T^2
    term is left out."""
    inter = intermediate or 4 * hidden
    layer = 2 * hidden * 3 * hidden + hidden * hidden + 3 * hidden * inter
    per_ttt = draft_layers * layer + hidden * draft_vocab
    return 2.0 * (3 * 3 * hidden * hidden + 3 * ttt_steps * per_ttt + hidden * draft_vocab)


@dataclass(frozen=True)
class Rate:
    """Throughputs of one measured run (an entry of rates.yaml), per device, with the shapes they
    were measured at. Defaults stand where an entry leaves a figure out."""

    accelerator: str  # cpu | gpu
    model: str
    params: float  # active parameters of the target measured (measured_params)
    capture_tok_s: float  # extract.py's capture, shards written
    train_tok_s: float  # train.py's tok/s, in train_precision (0 in an MoE entry: see moe)
    train_flops: float  # head_flops() of the run measured
    # a mixture-of-experts target: an entry of capture and regeneration figures only, which runs
    # of MoE targets take those from (a fused-expert prefill costs more per active parameter than
    # a dense one's); training, which does not see the target's kind, scales from the nearest
    # dense entry
    moe: bool = False
    regen_tok_s: float | None = None  # new tokens/s of data.regenerate (None: not measured)
    # capture with the forward in fp32, as on a CPU without native bf16 matmuls
    # (eagle3/target_model/compute_dtype.py); None: every capture here runs at capture_tok_s
    capture_fp32_tok_s: float | None = None
    capture_amx_tok_s: float | None = None  # a bf16 forward on AMX tiles (None: capture_tok_s)
    # capture.teacher_topk's projection (the target's norm + lm_head over its whole vocab in fp32,
    # log_softmax, top-k) in multiply-adds per second as the capture ran it: hidden x vocab of them a
    # token, on top of the forward. None: not measured there, counted as free (on a GPU it is a
    # matmul beside the forward's; on a CPU it is a fifth more work than SmolLM2's forward)
    teacher_topk_macs_s: float | None = None
    train_precision: str = "bf16-mixed"  # the topology.precision train_tok_s was measured in
    # bf16 autocast over fp32: a run in the other precision (a CPU without native bf16 resolves
    # precision=auto to fp32) is scaled by it where no rate of its own was measured
    bf16_speedup: float = 1.0
    train_amx_tok_s: float | None = None  # bf16 autocast on AMX tiles (CPU)
    train_fp32_tok_s: float | None = None  # fp32 where measured (else train_tok_s / bf16_speedup)
    # what a time budget (eagle3/planning/time_budget.py) sets aside besides the work itself, seconds;
    # the defaults are guesses for an entry that measured only the throughputs:
    start_s: float = 30.0  # one stage's start: imports, tokenizer, the target loaded
    regen_start_s: float = 0.0  # the regeneration engine's start, where regen_tok_s leaves it out
    regen_hf_tok_s: float | None = None  # regeneration by transformers where vLLM is absent
    regen_hf_start_s: float = 0.0
    # capture=vllm: its engine's start (profile, compilation, warm-up), which capture_tok_s leaves
    # out; the HF capture starts no engine
    capture_vllm_start_s: float = 0.0
    eval_s: float = 180.0  # train.py's acceptance evaluation at the budget's evaluation sizes
    eval_amx_s: float | None = None  # the same on a CPU with AMX tiles (None: eval_s)
    # figure -> what measured it (the command, the machine, what it counted): rates.yaml's sources
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    def eval_seconds(self, amx: bool = False) -> float:
        """train.py's acceptance evaluation; ``amx``: on a CPU with AMX tiles (vLLM's CPU kernels use them)."""
        return self.eval_amx_s if amx and self.eval_amx_s else self.eval_s

    def capture_rate(self, params: float, parallel: int, forward: str = "native") -> float:
        """``forward``: how the target runs (``cpu_forward()``): native, amx or fp32."""
        by_forward = {"fp32": self.capture_fp32_tok_s, "amx": self.capture_amx_tok_s}
        tok_s = by_forward.get(forward) or self.capture_tok_s
        return tok_s * self.params / params * parallel

    def train_rate(self, flops: float, precision: str | None = None, amx: bool = False) -> float:
        """``precision``: the resolved topology.precision; ``amx``: a CPU with AMX tiles."""
        scale = self.train_flops / flops
        if precision is None or precision == "auto" or precision == self.train_precision:
            return (self.train_amx_tok_s if amx and self.train_amx_tok_s else self.train_tok_s) * scale
        if "bf16" in precision:
            return self.train_tok_s * self.bf16_speedup * scale
        return (self.train_fp32_tok_s or self.train_tok_s / self.bf16_speedup) * scale


# the measured runs, as data: a recalibration is an edit of this file and no code
RATES_FILE = Path(__file__).with_name("rates.yaml")
_ENTRY_KEYS = frozenset({"accelerator", "model", "target", "head", "train_precision", "moe"})
_MOE_FIGURES = frozenset({"capture_tok_s", "capture_vllm_start_s", "regen_tok_s", "regen_start_s", "start_s"})


def measured_rates(path: str | Path | None = None) -> tuple[Rate, ...]:
    """The measured runs of ``path`` (default RATES_FILE), parsed once per version of the file."""
    file = Path(path or RATES_FILE)
    return _load_rates(file, file.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _load_rates(file: Path, _mtime_ns: int) -> tuple[Rate, ...]:
    entries = OmegaConf.to_container(OmegaConf.load(file))
    if not isinstance(entries, list):
        raise ValueError(f"{file}: expected a list of measured runs, got {type(entries).__name__}")
    return tuple(_rate(entry, f"{file} entry {i}") for i, entry in enumerate(entries))


def _rate(entry: dict[str, Any], where: str) -> Rate:
    """One entry of rates.yaml: shapes and labels, then ``<figure>: {value, source}`` each (a
    figure without the command that measured it is refused: it could not be checked again)."""
    figures = {k: v for k, v in entry.items() if k not in _ENTRY_KEYS}
    for name, fig in figures.items():
        if not isinstance(fig, dict) or set(fig) != {"value", "source"} or not str(fig["source"] or "").strip():
            raise ValueError(f"{where}: {name}: expected {{value: <number>, source: <what measured it>}}, got {fig!r}")
    moe = bool(entry.get("moe", False))
    if moe and not set(figures) <= _MOE_FIGURES:
        raise ValueError(f"{where}: an MoE entry holds {sorted(_MOE_FIGURES)} only, got {sorted(figures)}")
    try:
        return Rate(
            accelerator=str(entry["accelerator"]),
            model=str(entry["model"]),
            params=measured_params(entry["target"]),
            # an MoE entry's training figures are the dense entries' (run_rates)
            train_flops=head_flops(**entry["head"]) if not moe else 0.0,
            moe=moe,
            **({"train_tok_s": 0.0} if moe else {}),
            train_precision=str(entry.get("train_precision", "bf16-mixed")),
            sources={name: str(fig["source"]) for name, fig in figures.items()},
            **{name: float(fig["value"]) for name, fig in figures.items()},
        )
    except (KeyError, TypeError) as e:
        raise ValueError(f"{where} ({entry.get('model')} on {entry.get('accelerator')}): {e}") from None


def rate_for(accelerator: str, params: float, rates: Sequence[Rate] | None = None, moe: bool = False) -> Rate | None:
    """The measured run on this accelerator whose target is nearest in size (``rates``: the
    measured runs, default measured_rates()): a dense one, or with ``moe`` an MoE one (None
    where none was measured)."""
    same = [r for r in (measured_rates() if rates is None else rates) if r.accelerator == str(accelerator)]
    return min((r for r in same if r.moe == moe), key=lambda r: abs(math.log(r.params / params)), default=None)


def _cfg_moe(cfg: RunConfig) -> bool:
    """A mixture-of-experts target: its preset's extra_config routes tokens to experts."""
    extra = cfg.model.extra_config or {}
    return any(int(extra.get(k) or 0) > 1 for k in ("num_experts", "n_routed_experts", "num_local_experts"))


def _with_moe_capture(dense: Rate, moe: Rate) -> Rate:
    """``dense`` with the capture and regeneration figures of the MoE entry ``moe``."""
    capture = {k: getattr(moe, k) for k in ("params", "capture_tok_s", *(_MOE_FIGURES & set(moe.sources)))}
    return dataclasses.replace(
        dense,
        model=f"{moe.model} (capture) and {dense.model} (training)",
        capture_fp32_tok_s=None,
        capture_amx_tok_s=None,
        sources={**dense.sources, **moe.sources},
        **capture,
    )


def _cfg_params(cfg: RunConfig) -> float:
    """Active parameters of the config's target, from its preset (facts and extra_config)."""
    return target_size(preset_config(cfg.model)).active_params


@dataclass(frozen=True)
class RunRates:
    """One config's throughputs, derived once from the measured runs: what its cost lines and its
    time budget's shares divide by. Derive them once (run_rates) and pass them down: every figure
    of one estimate then comes from the same reading of the rates."""

    measured: Rate | None  # the measured run they are scaled from (None: none on this accelerator)
    basis: str  # a line saying which
    forward: str  # how the capture runs its target forward: cpu_forward()
    capture_tok_s: float | None  # over the config's replicas and extraction shards
    train_tok_s: float | None  # over all its ranks


def run_rates(cfg: RunConfig, rates: Sequence[Rate] | None = None) -> RunRates:
    """``cfg``'s rates, scaled from the measured run nearest its target (``rates``: the measured
    runs, default measured_rates()). Capture: data-parallel replicas and extraction shards
    (nodes) add up; tensor parallelism gets no credit (it mostly makes a large target fit)."""
    params, accelerator = _cfg_params(cfg), str(cfg.topology.accelerator)
    rate, forward = rate_for(accelerator, params, rates), cpu_forward(cfg)
    moe = rate_for(accelerator, params, rates, moe=True) if _cfg_moe(cfg) and rate is not None else None
    if rate is not None and moe is not None:
        rate = _with_moe_capture(rate, moe)
    if rate is None:
        basis = f"  (no rate measured on accelerator={accelerator}: {RATES_FILE.name})"
        return RunRates(None, basis, forward, None, None)
    scaled = "" if abs(math.log(rate.params / params)) < 0.05 else ", scaled to this model"
    basis = f"  (rates measured with {rate.model} on {rate.accelerator}{scaled}: eagle3/planning/{RATES_FILE.name})"
    m, h, topo = cfg.model, cfg.head, cfg.topology
    parallel = topo.extract_dp * max(1, cfg.num_shards)
    capture = rate.capture_rate(params, parallel, forward)
    if cfg.capture.teacher_topk is not None and rate.teacher_topk_macs_s:
        per_token = m.hidden_size * m.vocab_size / rate.teacher_topk_macs_s  # seconds, one replica
        capture = 1.0 / (1.0 / capture + per_token / parallel)
    flops = head_flops(
        m.hidden_size,
        h.intermediate_size or m.intermediate_size,
        min(h.draft_vocab_size, m.vocab_size),
        cfg.train.ttt_steps,
        h.num_draft_layers,
    )
    train = rate.train_rate(flops, str(topo.precision), amx=cpu_amx(cfg)) * topo.devices * topo.num_nodes
    return RunRates(rate, basis, forward, capture, train)


def cpu_forward(cfg: RunConfig) -> str:
    """How this config's capture runs its target forward, for its rate: ``fp32`` (the
    transformers backend on a CPU that would emulate the stored dtype, or an fp32 capture.dtype:
    the backend's own check, eagle3/target_model/compute_dtype.py), ``amx`` (bf16 on AMX tiles) or
    ``native`` (anything else, GPUs included)."""
    if str(cfg.topology.accelerator) != "cpu" or cfg.capture.backend != CaptureBackend.hf:
        return "native"
    import torch

    stored = torch_dtype(cfg.capture.dtype)
    if compute_dtype(stored, "cpu") == torch.float32:
        return "fp32"
    return "amx" if stored == torch.bfloat16 and cpu_amx(cfg) else "native"


def cpu_amx(cfg: RunConfig) -> bool:
    """A CPU topology on a CPU whose bf16 matmuls run on AMX tiles (oneDNN allowed to)."""
    return str(cfg.topology.accelerator) == "cpu" and cpu_bf16_on_amx()


def capture_seconds(cfg: RunConfig, tokens: int, rates: RunRates | None = None) -> float | None:
    """Seconds to capture ``tokens`` (None: no rate for this accelerator). ``rates``: cfg's, when
    the caller has them (default run_rates(cfg))."""
    tok_s = (rates or run_rates(cfg)).capture_tok_s
    return None if tok_s is None else tokens / tok_s


def extract_lines(cfg: RunConfig, rates: RunRates | None = None) -> list[str]:
    """Before any work, from the config alone: samples, a token bound, disk, time."""
    from eagle3.store.disk import format_bytes

    data, ids = cfg.data, [int(i) for i in cfg.layers.layer_ids]
    storage = StorageFormat.from_config(cfg.capture)
    length = data.max_length
    rates = rates or run_rates(cfg)
    rate, basis, tok_s, forward = rates.measured, rates.basis, rates.capture_tok_s, rates.forward
    at = f" at ~{tok_s:,.0f} tok/s" if tok_s else ""
    if tok_s and forward != "native":
        at += " (the forward in fp32: this CPU would emulate bf16)" if forward == "fp32" else " (bf16 on AMX tiles)"
    if data.max_samples is None:
        per_m = disk_estimate.disk_per_million_tokens(
            ids,
            cfg.model.hidden_size,
            cfg.capture.dtype,
            cfg.capture.shard_max_tokens,
            storage,
        )
        line = f"extract: every sample of data={data.name} (counted once read), <= {length:,} tokens each; {per_m} per 1M tokens"
        if tok_s:
            line += f"; capture ~{minutes(MILLION / tok_s)} per 1M tokens{at}"
        return [line, basis]
    samples = data.max_samples
    tokens = samples * length
    disk = disk_estimate.disk_bytes(
        tokens,
        ids,
        cfg.model.hidden_size,
        cfg.capture.dtype,
        cfg.capture.shard_max_tokens,
        storage,
    )
    line = f"extract: {samples:,} samples x <= {length:,} tokens = <= {tokens:,} tokens; disk <= {format_bytes(disk)}"
    if tok_s:
        line += f"; capture <= ~{minutes(tokens / tok_s)}{at}"
    lines = [line]
    if data.regenerate:
        turns = data.regen_max_turns or 1
        new = samples * turns * data.regen_max_tokens
        what = f"{turns} user turn(s)" if data.regen_max_turns else "the first user turns (later turns add more)"
        prompts = _self_prompt_tokens(cfg)  # data.mixture's self-prompts: written before they are answered
        new += prompts
        if prompts:
            what += f" and <= {prompts:,} for the prompts the target writes (data.mixture self_prompts)"
        regen = f"  + answers by the target first: <= {new:,} new tokens for {what}"
        if rate is not None and rate.regen_tok_s:
            regen += f", <= ~{minutes(new / (rate.regen_tok_s * cfg.topology.extract_dp))}"
        lines.append(regen)
    return lines + [basis]


def _self_prompt_tokens(cfg: RunConfig) -> int:
    """The most tokens data.mixture's self-prompt sources write (their share of data.max_samples
    conversations, prompt_max_tokens each); 0 without any."""
    data = cfg.data
    if not data.mixture or not data.max_samples:
        return 0
    total = sum(float(e.weight) for e in data.mixture)
    return sum(
        round(data.max_samples * float(e.weight) / total) * e.prompt_max_tokens
        for e in data.mixture
        if getattr(e.source, "value", e.source) == "self_prompts"
    )


def train_lines(
    cfg: RunConfig,
    train_tokens: int | None = None,
    train_batches: int | None = None,
    rates: RunRates | None = None,
) -> list[str]:
    """Steps x tokens per step, the passes over the data, and the time at the measured rate.
    ``train_tokens``/``train_batches``: the training split and its packed batches, when known.
    Under train.max_time the steps are those the clock allows at that rate, where fewer."""
    t, topo = cfg.train, cfg.topology
    world = topo.devices * topo.num_nodes
    per_rank = t.max_tokens_per_batch * t.accumulate_grad_batches
    fill: float = per_rank  # tokens a rank trains on per step
    if train_tokens and train_batches:
        fill = min(per_rank, train_tokens / train_batches * t.accumulate_grad_batches)
    rates = rates or run_rates(cfg)
    basis = rates.basis
    tok_s = rates.train_tok_s / world if rates.train_tok_s else None
    steps, by_clock = t.max_steps, False
    if tok_s and t.max_time and max_time_seconds(t.max_time) * tok_s / fill < steps:
        steps, by_clock = max(1, int(max_time_seconds(t.max_time) * tok_s / fill)), True
    ranks = f" ({per_rank:,} x {world} ranks)" if world > 1 else ""
    approx = "~" if by_clock else ""
    line = (
        f"train: {approx}{steps:,} steps x <= {per_rank * world:,} tokens{ranks} = <= {approx}"
        f"{steps * per_rank * world:,} tokens"
    )
    if train_tokens and train_batches:
        total = steps * fill * world
        line += (
            f" (batches hold ~{fill:,.0f} per rank: ~{total:,.0f} tokens, "
            f"~{total / train_tokens:.1f} passes over {train_tokens:,} train tokens)"
        )
    if tok_s:
        line += f"; ~{minutes(steps * fill / tok_s)} at ~{tok_s * world:,.0f} tok/s"
    if by_clock:
        line += f": the steps train.max_time={t.max_time} allows (the clock ends the run)"
    elif t.max_time:
        line += f", capped at train.max_time={t.max_time}"
    return [line, basis]


def max_time_seconds(max_time: str) -> float:
    """Lightning's "DD:HH:MM:SS" in seconds."""
    days, hours, mins, secs = (float(x) for x in max_time.split(":"))
    return ((days * 24 + hours) * 60 + mins) * 60 + secs


def lightning_max_time(seconds: float) -> str:
    """``seconds`` as Lightning's "DD:HH:MM:SS" (whole seconds, at least one)."""
    s = max(1, int(math.floor(seconds)))
    return f"{s // 86400:02d}:{s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}"
