"""One wall-clock budget for the whole pipeline (time_budget.minutes): extract.py sizes the data
from the measured rates, train.py trains for what the extraction left (the two commands ending
inside the minutes: integration/test_time_budget_pipeline.py)."""

from __future__ import annotations

import pytest
from conftest import compose

from eagle3.config.schema import run_config
from eagle3.extraction.identity import dataset_path
from eagle3.planning import cost, time_budget, train_clock
from eagle3.stages.narrow import dataset_identity


@pytest.fixture(autouse=True)
def cpu_with_native_bf16_without_amx(monkeypatch):
    """The shares do not depend on the machine the suite runs on (its rates do)."""
    from eagle3.target_model import compute_dtype as cd

    monkeypatch.setattr(cd, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16"}))
    monkeypatch.setattr(cd, "onednn_allows_bf16", lambda: True)


def _shares(*overrides: str, config: str = "train") -> time_budget.TimeShares:
    shares = time_budget.time_shares(run_config(compose(config, ["experiment=demo_cpu", *overrides])))
    assert shares is not None
    return shares


def test_no_budget_no_shares_and_the_config_is_untouched():
    cfg = run_config(compose("train", ["experiment=demo_cpu", "time_budget.minutes=null"]))
    assert time_budget.time_shares(cfg) is None
    assert time_budget.sized(cfg) == (cfg, None)
    assert train_clock.train_clock(cfg, 100.0) is None


def test_the_split_spends_the_minutes_and_grows_the_data_with_them():
    small = _shares("time_budget.minutes=20", "data.max_samples=null")
    large = _shares("time_budget.minutes=40", "data.max_samples=null")
    for s in (small, large):
        parts = s.fixed_s + s.regen_s + s.capture_s + s.train_s
        assert parts == pytest.approx(s.total_s)
        assert s.passes == pytest.approx(2.0, rel=0.01)  # the schema's time_budget.passes: the data fits it
        assert s.capped_by is None and s.samples == s.conversations
    assert large.conversations > 2 * small.conversations  # the fixed costs are paid once
    # more passes per sample: fewer samples in the same minutes, more of them training
    deeper = _shares("time_budget.minutes=20", "data.max_samples=null", "time_budget.passes=4")
    assert deeper.conversations < small.conversations and deeper.train_s > small.train_s
    assert "20.0 min in all" in small.lines()[0] and f"{small.conversations:,} conversations" in small.lines()[0]


def test_the_data_presets_cap_binds_and_the_spare_minutes_go_to_training():
    free = _shares("time_budget.minutes=20", "data.max_samples=null")
    capped = _shares("time_budget.minutes=20", "data.max_samples=300")
    assert capped.conversations == 300 < free.conversations
    assert capped.capped_by == "data.max_samples=300" and "the data's cap" in capped.lines()[0]
    assert capped.train_s > free.train_s and capped.passes > free.passes


def test_regeneration_and_several_answers_are_paid_for():
    own = _shares("time_budget.minutes=30", "data.max_samples=null")
    regen = _shares("time_budget.minutes=30", "data.max_samples=null", "data.regenerate=true", "data.regen_max_turns=1")
    assert own.regen_s == 0 and regen.regen_s > 0
    assert "regeneration ~" in regen.lines()[0] and "regeneration" not in own.lines()[0]
    two = _shares(
        "time_budget.minutes=30",
        "data.max_samples=null",
        "data.regenerate=true",
        "data.regen_max_turns=1",
        "data.regen_num_answers=2",
        "data.regen_temperature=0.7",
    )
    assert two.samples == 2 * two.conversations  # each answer a sample of its own
    assert two.conversations < regen.conversations


def test_a_budget_below_the_fixed_costs_is_refused_naming_them():
    with pytest.raises(ValueError, match=r"time_budget.minutes=1.*fixed costs"):
        _shares("time_budget.minutes=1")
    with pytest.raises(ValueError, match="passes > 0"):
        _shares("time_budget.minutes=20", "time_budget.passes=0")


def test_both_stages_size_the_same_dataset(smollm2_dir):
    """extract.py writes and train.py looks for the directory the shares name."""
    names = []
    for stage in ("extract", "train"):
        cfg, shares = time_budget.sized(
            run_config(compose(stage, ["experiment=demo_cpu", "time_budget.minutes=20", "data.max_samples=null"]))
        )
        assert shares is not None and cfg.data.max_samples == shares.conversations
        names.append(dataset_path(dataset_identity(cfg, str(smollm2_dir))).name)
    assert names[0] == names[1]
    plain = run_config(compose("train", ["experiment=demo_cpu", "time_budget.minutes=null", "data.max_samples=800"]))
    assert dataset_path(dataset_identity(plain, str(smollm2_dir))).name != names[0]


def test_training_gets_what_the_extraction_and_the_end_leave():
    cfg = run_config(compose("train", ["experiment=demo_cpu", "time_budget.minutes=20"]))
    clock = train_clock.train_clock(cfg, extract_s=400.0)
    assert clock is not None
    assert clock.fit_s == pytest.approx(1200 - 400 - clock.started_s - clock.reserve_s)
    assert clock.reserve_s >= 180  # the acceptance evaluation at the end (eval.enabled)
    timed = train_clock.timed_train(cfg, clock)
    secs = int(clock.fit_s)
    assert timed.train.max_time == f"00:00:{secs // 60:02d}:{secs % 60:02d}"
    assert timed.train.max_steps > cfg.train.max_steps  # the clock, not the step count, ends it
    no_eval = run_config(compose("train", ["experiment=demo_cpu", "time_budget.minutes=20", "eval.enabled=false"]))
    assert train_clock.train_clock(no_eval, 400.0).fit_s > clock.fit_s  # type: ignore[union-attr]
    assert clock.over_s() == 0 and "training gets" in clock.line()
    # an extraction that took the whole budget: training still gets its floor, and says the cost
    late = train_clock.train_clock(cfg, extract_s=1190.0)
    assert late is not None and late.fit_s == pytest.approx(train_clock.MIN_FIT_FRACTION * 1200)
    assert late.over_s() == pytest.approx(1190.0 + late.started_s + late.reserve_s + late.fit_s - 1200)
    assert "nothing is left to train" in late.line() and "past its minutes" in late.line()


def test_make_demo_is_sized_by_twenty_minutes_of_the_cpu_it_runs_on(monkeypatch):
    """experiment=demo_cpu: as many samples as this kind of CPU captures and trains in 20
    minutes with the acceptance evaluation; AMX tiles capture 2.6x as fast as bf16 dot products."""
    from eagle3.target_model import compute_dtype as cd

    native = _shares()
    assert native.total_s == 1200 and native.capped_by is None and 500 < native.conversations < 2000
    monkeypatch.setattr(cd, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}))
    amx = _shares()
    assert amx.conversations > 1.5 * native.conversations
    # vLLM's CPU kernels run on the tiles too: the acceptance evaluation is reserved what it took there
    (smollm2_cpu,) = [r for r in cost.measured_rates() if r.accelerator == "cpu" and r.model == "SmolLM2-135M"]
    assert amx.eval_s == smollm2_cpu.eval_amx_s < native.eval_s == smollm2_cpu.eval_s
    monkeypatch.setattr(cd, "cpu_flags", lambda: frozenset({"avx2", "fma"}))  # bf16 emulated: fp32
    fp32 = _shares()
    assert fp32.conversations < native.conversations and fp32.eval_s == native.eval_s
