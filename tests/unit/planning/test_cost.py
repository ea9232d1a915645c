"""What a run will cost, said before it starts: the figures follow from the config (samples x
max_length, steps x tokens per step, ranks, disk from eagle3/planning/disk_estimate.py, time from the measured
rates); both stages printing them and writing them to the run's log: integration/test_cost_cli.py."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT, compose
from helpers.printed import printed_number

from eagle3.planning.cost import (
    capture_seconds,
    extract_lines,
    head_flops,
    measured_params,
    measured_rates,
    rate_for,
    run_rates,
    train_lines,
)
from eagle3.planning.disk_estimate import disk_bytes
from eagle3.store.disk import format_bytes
from eagle3.store.storage_format import StorageFormat

CPU_RATE = next(r for r in measured_rates() if r.accelerator == "cpu")
SMOL_SHAPE = dict(
    num_layers=30, hidden=576, intermediate=1536, vocab=49152, heads=9, kv_heads=3, tie_word_embeddings=True
)
AVX512_BF16 = frozenset({"avx2", "avx512f", "avx512_bf16"})


@pytest.fixture(autouse=True)
def cpu_with_native_bf16_without_amx(monkeypatch):
    """The estimates below do not depend on the machine the suite runs on: its CPU is faked as
    one with bf16 dot products and no AMX (the rate `capture_tok_s` stands for)."""
    from eagle3.target_model import compute_dtype as cd

    monkeypatch.setattr(cd, "cpu_flags", lambda: AVX512_BF16)
    monkeypatch.setattr(cd, "onednn_allows_bf16", lambda: True)


def test_extract_estimate_follows_the_config():
    cfg = compose("extract", ["data.max_samples=300", "data.max_length=512"])
    line = extract_lines(cfg)[0]
    tokens = 300 * 512
    assert f"300 samples x <= 512 tokens = <= {tokens:,} tokens" in line
    # the CPU's storage format (capture.storage=fp8): the aux layers in 1 byte and a scale
    assert (
        f"disk <= {format_bytes(disk_bytes(tokens, [2, 15, 27, 30], 576, 'bfloat16', 65536, StorageFormat('fp8')))}"
        in line
    )
    # SmolLM2 on the CPU is the measured entry itself: tokens / its capture rate
    secs = capture_seconds(cfg, tokens)
    assert secs == pytest.approx(tokens / CPU_RATE.capture_tok_s)
    assert f"capture <= ~{secs / 60:.1f} min at ~{CPU_RATE.capture_tok_s:,.0f} tok/s" in line
    regen = extract_lines(
        compose("extract", ["data.regenerate=true", "data.max_samples=200", "data.regen_max_tokens=256"])
    )
    # 200 first turns x regen_max_tokens 256, at the measured regeneration rate
    assert (
        f"<= 51,200 new tokens for the first user turns (later turns add more), <= ~{51_200 / CPU_RATE.regen_tok_s / 60:.1f} min"
        in regen[1]
    )


@pytest.mark.parametrize(
    "flags, onednn, forward",
    [
        (AVX512_BF16, True, "native"),
        (AVX512_BF16 | {"amx_bf16"}, True, "amx"),
        (frozenset({"avx2", "fma"}), True, "fp32"),  # no bf16 instructions: emulated
        (AVX512_BF16 | {"amx_bf16"}, False, "fp32"),  # oneDNN capped below them (ONEDNN_MAX_CPU_ISA)
    ],
)
def test_the_capture_rate_follows_how_this_cpu_runs_the_forward(monkeypatch, flags, onednn, forward):
    from eagle3.planning.cost import cpu_forward
    from eagle3.target_model import compute_dtype as cd

    monkeypatch.setattr(cd, "cpu_flags", lambda: flags)
    monkeypatch.setattr(cd, "onednn_allows_bf16", lambda: onednn)
    cfg = compose("extract", ["data.max_samples=100", "data.max_length=100"])
    assert cpu_forward(cfg) == forward
    want = {"native": CPU_RATE.capture_tok_s, "amx": CPU_RATE.capture_amx_tok_s, "fp32": CPU_RATE.capture_fp32_tok_s}
    assert want[forward] and capture_seconds(cfg, 10_000) == pytest.approx(10_000 / want[forward])
    line = extract_lines(cfg)[0]
    assert f"at ~{want[forward]:,.0f} tok/s" in line
    assert ("this CPU would emulate bf16" in line) is (forward == "fp32")
    # training: bf16 autocast on AMX tiles has its own measured rate
    cfg = compose("train", ["head=compact", "topology.precision=bf16-mixed"])  # the head the rate was measured with
    want_train = CPU_RATE.train_amx_tok_s if forward == "amx" else CPU_RATE.train_tok_s
    assert f"at ~{want_train:,.0f} tok/s" in train_lines(cfg)[0]
    # a GPU's capture never takes a CPU rate
    assert cpu_forward(compose("extract", ["topology=gpu1"])) == "native"


def test_train_estimate_is_steps_times_tokens_per_step_over_ranks():
    cfg = compose("train", ["head=compact", "train.max_steps=150", "train.max_tokens_per_batch=2048"])
    line = train_lines(cfg)[0]
    assert "train: 150 steps x <= 2,048 tokens = <= 307,200 tokens" in line
    minutes, tok_s = re.search(r"~([\d.]+) min at ~([\d,]+) tok/s", line).groups()
    assert printed_number(minutes) == pytest.approx(150 * 2048 / printed_number(tok_s) / 60, abs=0.06)
    # 4x the draft vocabulary: more FLOPs per token, a lower rate than the one measured at 4096
    wide = train_lines(compose("train", ["head=compact", "head.draft_vocab_size=16384"]))[0]
    assert printed_number(re.search(r"at ~([\d,]+) tok/s", wide).group(1)) < CPU_RATE.train_tok_s
    # the measured split: packed batches' mean fill decides the tokens trained on and the passes
    known = train_lines(cfg, train_tokens=50_000, train_batches=40)[0]
    assert "batches hold ~1,250 per rank: ~187,500 tokens, ~3.8 passes over 50,000 train tokens" in known
    # the CPU rate was measured in bf16 autocast: a CPU whose precision resolves to fp32 (no
    # native bf16) gets the fp32 rate measured as such a CPU runs it, rather than a bf16 estimate
    rates = {
        precision: printed_number(
            re.search(
                r"at ~([\d,]+) tok/s",
                train_lines(compose("train", ["head=compact", f"topology.precision={precision}"]))[0],
            ).group(1)
        )
        for precision in ("bf16-mixed", "32-true")
    }
    assert rates["bf16-mixed"] == pytest.approx(CPU_RATE.train_tok_s, rel=0.01)
    assert rates["32-true"] == pytest.approx(CPU_RATE.train_fp32_tok_s, rel=0.01)
    assert rates["32-true"] < rates["bf16-mixed"]
    ddp = train_lines(compose("train", ["experiment=smollm2_full", "topology=gpu2_tp2"]))[0]
    assert "8,800 steps x <= 16,384 tokens (8,192 x 2 ranks) = <= 144,179,200 tokens" in ddp


def test_rates_scale_with_the_model_and_pick_the_accelerator():
    smol = measured_params(SMOL_SHAPE)
    assert smol == pytest.approx(1.345e8, rel=0.01)  # SmolLM2-135M, its embeddings tied
    llama = dict(num_layers=32, hidden=4096, intermediate=14336, vocab=128256, heads=32, kv_heads=8)
    assert measured_params(llama) == pytest.approx(8.03e9, rel=0.005)  # Llama-3.1-8B's published count
    assert rate_for("gpu", measured_params(llama)).model == "Llama-3.1-8B"
    # one counter: a run of the preset measured is sized as its entry is (no scaling), and as the
    # serving advice sizes the target from its config.json (eagle3/target_model/size.py)
    from eagle3.planning import cost

    assert cost._cfg_params(compose("extract", [])) == CPU_RATE.params
    assert rate_for("cpu", smol) == CPU_RATE and rate_for("tpu", smol) is None
    assert head_flops(576, 1536, 4096, 5) > head_flops(576, 1536, 4096, 3)
    kimi = compose("extract", ["model=kimi_k2_5", "topology=gpu8_tp8", "capture=vllm"])
    llama = compose("extract", ["model=llama3_1_8b", "topology=gpu1"])
    assert capture_seconds(kimi, 10**6) > 3 * capture_seconds(llama, 10**6)  # a larger target captures slower
    assert (
        "scaled to this model" in extract_lines(kimi)[-1]
        and "no rate measured" in extract_lines(compose("extract", ["topology.accelerator=tpu"]))[-1]
    )


def test_an_moe_target_takes_capture_from_the_moe_entry_and_training_from_the_dense_one(tmp_path):
    """Qwen3-30B-A3B at 24 of 48 layers captured at 24,599 tok/s on the H200, where the dense
    8B entry scaled to its active parameters says ~91,800: an MoE run takes the MoE entry's capture and regeneration,
    and its training (which sees only the head) from the dense entry; a dense run never sees the
    MoE entry."""
    import yaml

    from eagle3.planning import cost

    moe = compose("extract", ["experiment=qwen3_30b_a3b", "model.num_layers=24"])
    rates = run_rates(moe)
    assert rates.capture_tok_s == pytest.approx(24599)  # the measured shapes: no scaling
    assert rates.measured.regen_tok_s == 13900 and rates.measured.regen_start_s == 59
    without = run_rates(moe, [r for r in measured_rates() if not r.moe])  # the dense entries alone
    assert without.capture_tok_s / rates.capture_tok_s > 3  # what the estimate would say without the MoE entry
    assert rates.train_tok_s == without.train_tok_s  # training: the dense entry's, for this head
    assert rates.measured.sources["train_tok_s"] == without.measured.sources["train_tok_s"]
    assert "Qwen3-30B-A3B (24 of 48 layers) (capture) and Llama-3.1-8B (training)" in rates.basis
    # the uncut target: scaled from the cut by size, half the layers, about half the rate
    assert 0.4 < run_rates(compose("extract", ["experiment=qwen3_30b_a3b"])).capture_tok_s / 24599 < 0.6
    # a dense target of the same size class never takes the MoE entry
    small_dense = compose("extract", ["experiment=llama3_1_8b", "model.num_layers=6"])
    assert run_rates(small_dense).measured.model == "Llama-3.1-8B"
    assert rate_for("gpu", cost._cfg_params(moe)).model == "Llama-3.1-8B"  # dense by default
    # an MoE entry with a training figure is refused: training is the dense entries'
    entries = yaml.safe_load(cost.RATES_FILE.read_text())
    entry = next(e for e in entries if e.get("moe"))
    entry["train_tok_s"] = {"value": 1.0, "source": "a training figure in an MoE entry"}
    bad = tmp_path / "rates.yaml"
    bad.write_text(yaml.safe_dump(entries))
    with pytest.raises(ValueError, match="an MoE entry holds .* only, got .*train_tok_s"):
        measured_rates(bad)


def test_every_measured_figure_says_what_measured_it():
    """rates.yaml: each figure with a source (the command and what it counted), each entry's
    shapes in it, the file shipped with the package."""
    from eagle3.planning.cost import RATES_FILE

    rates = measured_rates()
    assert {(r.accelerator, r.model) for r in rates} >= {("cpu", "SmolLM2-135M"), ("gpu", "Llama-3.1-8B")}
    for r in rates:
        assert {"capture_tok_s", "train_tok_s"} - ({"train_tok_s"} if r.moe else set()) <= set(r.sources)
        assert all(len(source) > 20 for source in r.sources.values())
    assert CPU_RATE.params == measured_params(SMOL_SHAPE)
    assert CPU_RATE.train_flops == head_flops(576, 1536, 4096, 3)
    assert 'rates.yaml"]' in (ROOT / "pyproject.toml").read_text() and RATES_FILE.parent.name == "planning"


def test_a_figure_without_its_source_is_refused(tmp_path):
    import yaml

    from eagle3.planning.cost import RATES_FILE

    entries = yaml.safe_load(RATES_FILE.read_text())
    entries[0]["capture_tok_s"] = 906
    bad = tmp_path / "rates.yaml"
    bad.write_text(yaml.safe_dump(entries))
    with pytest.raises(ValueError, match=r"entry 0: capture_tok_s: expected \{value: <number>, source"):
        measured_rates(bad)


def test_a_recalibration_is_an_edit_of_the_rates_file(tmp_path, monkeypatch):
    """The estimates follow the file: a copy with another capture rate gives another time."""
    import yaml

    from eagle3.planning import cost

    entries = yaml.safe_load(cost.RATES_FILE.read_text())
    entries[0]["capture_tok_s"]["value"] = 2 * CPU_RATE.capture_tok_s
    copy = tmp_path / "rates.yaml"
    copy.write_text(yaml.safe_dump(entries))
    cfg = compose("extract", ["data.max_samples=100", "data.max_length=100"])
    before = capture_seconds(cfg, 10_000)
    monkeypatch.setattr(cost, "RATES_FILE", copy)
    assert capture_seconds(cfg, 10_000) == pytest.approx(before / 2)
    rates = cost.run_rates(cfg)  # derived once, passed down: the same figures as from the config
    assert capture_seconds(cfg, 10_000, rates) == capture_seconds(cfg, 10_000)
    assert extract_lines(cfg, rates) == extract_lines(cfg)


def test_the_teacher_top_k_slows_the_cpu_capture_by_its_measured_projection():
    """capture.teacher_topk adds hidden x vocab multiply-adds a token (the target's lm_head over its
    whole vocab): the CPU's plan counts them at the measured rate; a GPU entry measured none."""
    plain = run_rates(compose("extract", ["capture.storage=fp8"])).capture_tok_s
    topk = run_rates(compose("extract", ["capture.storage=fp8", "capture.teacher_topk=32"])).capture_tok_s
    assert CPU_RATE.teacher_topk_macs_s and plain is not None and topk is not None
    per_token = 576 * 49152 / CPU_RATE.teacher_topk_macs_s
    assert 1 / topk == pytest.approx(1 / plain + per_token) and 0.4 < topk / plain < 0.9
    # two extraction shards: each runs its own projection
    two = run_rates(compose("extract", ["capture.storage=fp8", "capture.teacher_topk=32", "num_shards=2"]))
    assert two.capture_tok_s == pytest.approx(2 * topk)
    gpu = ["experiment=smollm2_full", "capture.storage=fp8"]
    assert run_rates(compose("extract", [*gpu, "capture.teacher_topk=32"])).capture_tok_s == pytest.approx(
        run_rates(compose("extract", gpu)).capture_tok_s
    )
