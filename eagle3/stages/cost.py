"""What a run will cost, said before it starts: extract.py and train.py log a few lines
(printed, and written to the run's log, ``<run dir>/<task>.log``), e.g. for the CPU default:

    extract: 800 samples x <= 384 tokens = <= 307,200 tokens; disk <= 1.3 GiB; capture <= ~5.7 min at ~906 tok/s
    train: 800 steps x <= 1,024 tokens = <= 819,200 tokens (batches hold ~775 per rank: ~620,373
           tokens, ~2.2 passes over 280,719 train tokens); ~7.8 min at ~1,325 tok/s

Times divide those token counts by RATES: throughputs measured on real runs (each entry names
the command and the machine), scaled to the run's shapes where they differ from the measured
ones (capture by the target's parameters, training by the draft's FLOPs per token, both by the
devices used). Most were measured on a machine running nothing else: other jobs on its cores
slow a run down.
Training logs an updated ETA from its own step times once a few steps have run
(eagle3/training/callbacks.py, TrainEta).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from eagle3.config.schema import CaptureBackend, RunConfig
from eagle3.stages import disk_plan
from eagle3.stages.disk_plan import MILLION
from eagle3.target_model.compute_dtype import compute_dtype, cpu_bf16_on_amx
from eagle3.util.hidden_dtypes import torch_dtype
from eagle3.util.report import minutes


def target_params(
    num_layers: int,
    hidden: int,
    intermediate: int | None,
    vocab: int,
    heads: int | None = None,
    kv_heads: int | None = None,
) -> float:
    """Dense parameters of a Llama-shaped target (an MoE: about its active ones)."""
    kv = hidden * (kv_heads or heads or 1) // (heads or 1)
    per_layer = hidden * (2 * hidden + 2 * kv) + 3 * hidden * (intermediate or 4 * hidden)
    return float(num_layers * per_layer + vocab * hidden)


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
    """Throughputs of one measured run, per device, with the shapes they were measured at."""

    accelerator: str  # cpu | gpu
    model: str
    params: float  # target_params() of the model measured
    capture_tok_s: float  # extract.py's capture, shards written
    train_tok_s: float  # train.py's tok/s, in train_precision
    train_flops: float  # head_flops() of the run measured
    regen_tok_s: float | None  # new tokens/s of data.regenerate (None: not measured)
    measured: str  # the command, the machine and where the figure is recorded
    # capture tok/s with the forward in fp32, as on a CPU without native bf16 matmuls
    # (eagle3/target_model/compute_dtype.py); None: every capture on this accelerator runs capture_tok_s
    capture_fp32_tok_s: float | None = None
    # capture tok/s of a bf16 forward on a CPU with AMX tiles (amx_bf16); None: capture_tok_s
    capture_amx_tok_s: float | None = None
    train_precision: str = "bf16-mixed"  # the topology.precision train_tok_s was measured in
    # train tok/s in bf16 autocast over fp32 where both were measured: a run in the other
    # precision (a CPU without native bf16 resolves precision=auto to fp32) is scaled by it
    bf16_speedup: float = 1.0
    train_amx_tok_s: float | None = None  # train tok/s in bf16 autocast on AMX tiles (CPU)
    train_fp32_tok_s: float | None = None  # train tok/s in fp32 where measured (else / bf16_speedup)
    # what a time budget (eagle3/stages/time_budget.py) sets aside besides the work itself, seconds:
    start_s: float = 30.0  # one stage's start: imports, tokenizer, the target loaded
    regen_start_s: float = 0.0  # the regeneration engine's start, where regen_tok_s leaves it out
    regen_hf_tok_s: float | None = None  # regeneration by transformers where vLLM is absent
    regen_hf_start_s: float = 0.0
    eval_s: float = 180.0  # train.py's vLLM check at the budget's evaluation sizes

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


_SMOLLM2 = target_params(30, 576, 1536, 49152, 9, 3)
_LLAMA_8B = target_params(32, 4096, 14336, 128256, 32, 8)
RATES = (
    Rate(
        "cpu",
        "SmolLM2-135M",
        _SMOLLM2,
        # extract.py experiment=demo_cpu (290,568 tokens, shards written), a quiet 2-core host:
        # 906-933 tok/s on the host measured first (bf16 dot products); 2,369 with AMX tiles;
        # 867 with the forward in fp32 where bf16 would be emulated (oneDNN and ATen capped to
        # AVX2; bf16 there: 117 tok/s, bench/cpu_capture_dtype.py). docs/results.md section 1
        capture_tok_s=906,
        capture_amx_tok_s=2_369,
        capture_fp32_tok_s=867,
        # bf16 autocast (topology.precision=auto on a CPU with avx512_bf16): 704 tok/s in fp32
        # times 1.88, the fp32 / bf16 step-time ratio measured back to back (1.28 / 0.68 s) on
        # the host measured first. On a quiet host with AMX tiles: 0.44 s per demo_cpu step
        # (~775 tokens: 1,761 tok/s) in bf16, 0.71 s (1,092 tok/s) in fp32 with oneDNN and ATen
        # capped to AVX2, as a CPU without native bf16 runs it (docs/results.md section 1)
        train_tok_s=1_325,
        train_flops=head_flops(576, 1536, 4096, 3),
        train_precision="bf16-mixed",
        bf16_speedup=1.88,
        train_amx_tok_s=1_761,
        train_fp32_tok_s=1_092,
        regen_tok_s=166,
        start_s=25.0,
        # the vLLM check, both engines: ~3 min on a quiet host (docs/results.md section 1), 3.75 min
        # (130 s + 95 s) and ~4.6 min (165 s + ~110 s) in make demo on a CPU without native bf16
        # (section 12)
        eval_s=300.0,
        measured="make demo on this project's 2-core CPU with nothing else running (docs/results.md, "
        "section 1): capture 906 tok/s (AMX: 2,369; fp32 forward: 867), training 1,325 tok/s in bf16 "
        "(AMX: 1,761; fp32: 1,092); regeneration (vLLM, "
        "engine start included) from `python extract.py experiment=demo_cpu` with an empty cache on the "
        "same CPU shared with other jobs (load 4-5): 45,556 new tokens in 4 min 35 s",
    ),
    Rate(
        "gpu",
        "SmolLM2-135M",
        _SMOLLM2,
        # HF capture inside extract.py experiment=smollm2_budget (two answered turns, ~500-token
        # samples): 174,621 and 172,782 tok/s over 11,736 and 5,533 samples (section 12); 98,982 in
        # section 6's bench with other samples
        capture_tok_s=172_000,
        # the fit of experiment=smollm2_budget time_budget.minutes=17 (section 12): 11.2 passes over
        # 5.82M training tokens in 364.8 s of train.max_time, validations and compilation included
        train_tok_s=178_700,
        train_flops=head_flops(576, 6144, 32000, 3),
        # CUDA vLLM 0.26.0 inside extract.py (experiment=smollm2_budget: two user turns; 3.73M new
        # tokens of 11,391 conversations in ~300 s, 4.09M of 12,484 in ~285 s and 1.93M of 5,913 in
        # ~140 s after the engine start, section 12). One turn of 1,024 first turns alone runs at
        # 28,523 new tok/s; the second turn waits for the first and its prompts are longer (section
        # 7). Engine start: 69-91 s
        regen_tok_s=14_000,
        regen_start_s=90.0,
        regen_hf_tok_s=22_000,
        regen_hf_start_s=6.0,
        start_s=45.0,
        eval_s=180.0,  # both eager engines of train.py's check: 109 s + 62 s (section 12)
        measured="experiment=smollm2_budget on one H200 (docs/results.md section 12: capture ~172k tok/s, "
        "training 178,700 tok/s over a budget's fit at ttt 3, regeneration of two turns by CUDA vLLM "
        "~14k new tok/s inside extract.py; fast decode ~22k on first turns, section 7)",
    ),
    Rate(
        "gpu",
        "Llama-3.1-8B",
        _LLAMA_8B,
        capture_tok_s=33_062,
        train_tok_s=52_515,
        train_flops=head_flops(4096, 14336, 32000, 3),
        regen_tok_s=None,
        measured="bench/extract_throughput.py and bench/train_throughput.py --preset llama3-8b on one H200 "
        "(docs/results.md sections 3 and 6: capture 33,062 tok/s, compiled step 52,515 tok/s at ttt 3)",
    ),
)


def rate_for(accelerator: str, params: float) -> Rate | None:
    """The measured run on this accelerator whose target is nearest in size."""
    same = [r for r in RATES if r.accelerator == str(accelerator)]
    return min(same, key=lambda r: abs(math.log(r.params / params)), default=None)


def _cfg_params(cfg: RunConfig) -> float:
    m = cfg.model
    return target_params(
        m.num_layers,
        m.hidden_size,
        m.intermediate_size,
        m.vocab_size,
        m.num_attention_heads,
        m.num_key_value_heads,
    )


def rate_of(cfg: RunConfig) -> tuple[Rate | None, str]:
    """The measured rate this config's times come from, and a line saying which."""
    rate = rate_for(cfg.topology.accelerator, _cfg_params(cfg))
    if rate is None:
        return None, f"  (no rate measured on accelerator={cfg.topology.accelerator}: eagle3/stages/cost.py RATES)"
    scaled = "" if abs(math.log(rate.params / _cfg_params(cfg))) < 0.05 else ", scaled to this model"
    return rate, f"  (rates measured with {rate.model} on {rate.accelerator}{scaled}: eagle3/stages/cost.py)"


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


def capture_tok_s(cfg: RunConfig) -> float | None:
    """Capture tokens/s of this config: data-parallel replicas and extraction shards (nodes)
    add up; tensor parallelism gets no credit (it mostly makes a large target fit)."""
    rate, _ = rate_of(cfg)
    if rate is None:
        return None
    return rate.capture_rate(_cfg_params(cfg), cfg.topology.extract_dp * max(1, cfg.num_shards), cpu_forward(cfg))


def capture_seconds(cfg: RunConfig, tokens: int) -> float | None:
    """Seconds to capture ``tokens`` (None: no rate for this accelerator)."""
    tok_s = capture_tok_s(cfg)
    return None if tok_s is None else tokens / tok_s


def extract_lines(cfg: RunConfig) -> list[str]:
    """Before any work, from the config alone: samples, a token bound, disk, time."""
    from eagle3.store.disk import format_bytes

    data, ids = cfg.data, [int(i) for i in cfg.layers.layer_ids]
    length = data.max_length
    rate, basis = rate_of(cfg)
    tok_s = capture_tok_s(cfg)
    at = f" at ~{tok_s:,.0f} tok/s" if tok_s else ""
    forward = cpu_forward(cfg)
    if tok_s and forward != "native":
        at += " (the forward in fp32: this CPU would emulate bf16)" if forward == "fp32" else " (bf16 on AMX tiles)"
    if data.max_samples is None:
        per_m = disk_plan.disk_per_million_tokens(
            ids, cfg.model.hidden_size, cfg.capture.dtype, cfg.capture.shard_max_tokens
        )
        line = f"extract: every sample of data={data.name} (counted once read), <= {length:,} tokens each; {per_m} per 1M tokens"
        if tok_s:
            line += f"; capture ~{minutes(MILLION / tok_s)} per 1M tokens{at}"
        return [line, basis]
    samples = data.max_samples
    tokens = samples * length
    disk = disk_plan.disk_bytes(tokens, ids, cfg.model.hidden_size, cfg.capture.dtype, cfg.capture.shard_max_tokens)
    line = f"extract: {samples:,} samples x <= {length:,} tokens = <= {tokens:,} tokens; disk <= {format_bytes(disk)}"
    if tok_s:
        line += f"; capture <= ~{minutes(tokens / tok_s)}{at}"
    lines = [line]
    if data.regenerate:
        turns = data.regen_max_turns or 1
        new = samples * turns * data.regen_max_tokens
        what = f"{turns} user turn(s)" if data.regen_max_turns else "the first user turns (later turns add more)"
        regen = f"  + answers by the target first: <= {new:,} new tokens for {what}"
        if rate is not None and rate.regen_tok_s:
            regen += f", <= ~{minutes(new / (rate.regen_tok_s * cfg.topology.extract_dp))}"
        lines.append(regen)
    return lines + [basis]


def train_lines(cfg: RunConfig, train_tokens: int | None = None, train_batches: int | None = None) -> list[str]:
    """Steps x tokens per step, the passes over the data, and the time at the measured rate.
    ``train_tokens``/``train_batches``: the training split and its packed batches, when known.
    Under train.max_time the steps are those the clock allows at that rate, where fewer."""
    t, topo = cfg.train, cfg.topology
    world = topo.devices * topo.num_nodes
    per_rank = t.max_tokens_per_batch * t.accumulate_grad_batches
    fill: float = per_rank  # tokens a rank trains on per step
    if train_tokens and train_batches:
        fill = min(per_rank, train_tokens / train_batches * t.accumulate_grad_batches)
    rate, basis = rate_of(cfg)
    tok_s = train_tok_s(cfg) / world if rate is not None else None
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


def train_tok_s(cfg: RunConfig) -> float:
    """Training tokens/s of this config over all its ranks (1.0 without a measured rate)."""
    rate, _ = rate_of(cfg)
    if rate is None:
        return 1.0
    m, t, topo = cfg.model, cfg.train, cfg.topology
    flops = head_flops(
        m.hidden_size,
        t.intermediate_size or m.intermediate_size,
        min(t.draft_vocab_size, m.vocab_size),
        t.ttt_steps,
        t.num_draft_layers,
    )
    return rate.train_rate(flops, str(topo.precision), amx=cpu_amx(cfg)) * topo.devices * topo.num_nodes
