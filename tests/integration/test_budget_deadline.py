"""time_budget's deadlines inside extract.py: regeneration starts no batch that would end past its
share, capture stops at its deadline (the extraction's share and part of training's:
time_budget.capture_deadline), and the dataset is finished with the samples done in time
(validation among them, the cut in its provenance)."""

from __future__ import annotations

import json

from conftest import compose
from helpers import ScriptedDeadline, TickingClock

from eagle3.data import ChatSource, Regeneration, prepare_samples
from eagle3.planning import time_budget
from eagle3.stages.extract import run as extract
from eagle3.store import Manifest
from eagle3.target_model.generate.common import AnswerSettings
from eagle3.target_model.generate.hf_engine import HFRegenerator
from eagle3.util.clock import Deadline


def _chats(tmp_path, n: int):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "chats.jsonl"
    with open(path, "w") as f:
        for i in range(n):
            q = [{"role": "user", "content": f"Name a colour, number {i}."}, {"role": "assistant", "content": "x"}]
            f.write(json.dumps({"id": f"c{i}", "messages": q}) + "\n")
    return path


def _regenerate(smollm2_dir, tmp_path, deadline: Deadline):
    from transformers import AutoTokenizer

    regen = HFRegenerator(smollm2_dir, tmp_path / "cache", answers=AnswerSettings(max_tokens=4, max_model_len=128))
    data = prepare_samples(
        ChatSource("jsonl", str(_chats(tmp_path, 12))),
        AutoTokenizer.from_pretrained(smollm2_dir),
        max_samples=None,
        max_length=128,
        overflow="drop",
        val_fraction=0.25,
        seed=0,
        progress=False,
        regeneration=Regeneration(regen, 4, deadline),
    )
    return regen, data


def test_regeneration_stops_at_its_deadline(smollm2_dir, tmp_path):
    """Three batches of 4 would answer the 12 conversations; the deadline passes before the third."""
    # seconds left, per question: before batch 1; sizing batch 2, before it; sizing batch 3, before it
    regen, data = _regenerate(smollm2_dir, tmp_path / "a", ScriptedDeadline([1e6, 1e6, 1e6, 0.0]))
    assert regen.generated == 8 and len(data.train) + len(data.val) == 8
    assert regen.engine_start_s > 0  # the model's load, left out of the pace
    why = data.report.deadline_stop
    assert why is not None and "8 conversations regenerated" in why
    assert ("stopped early", why) in data.report.rows()


def test_regeneration_starts_no_batch_it_cannot_finish(smollm2_dir, tmp_path):
    """Time is left, but less than one batch took: the second batch does not start."""
    regen, data = _regenerate(smollm2_dir, tmp_path / "b", ScriptedDeadline([1e6, 1e-6]))
    assert regen.generated == 4 and len(data.train) + len(data.val) == 4
    assert "the next 4 would take" in (data.report.deadline_stop or "")


def test_no_deadline_answers_everything(smollm2_dir, tmp_path):
    regen, data = _regenerate(smollm2_dir, tmp_path / "c", ScriptedDeadline([1e6]))
    assert regen.generated == 12 and data.report.deadline_stop is None


def test_a_capture_past_its_deadline_finishes_the_dataset_with_what_it_captured(tmp_path, monkeypatch, capsys):
    """extract.py (tiny random Llama, real ShareGPT) under a budget whose capture share runs out
    after 12 samples: the dataset is complete with those 12, validation among them, its vocabulary
    built from them, the cut recorded; running the command again finds it complete."""
    clock = TickingClock()
    # reads of the clock: one for the "ends by" line, then one per captured sample
    monkeypatch.setattr(time_budget, "capture_deadline", lambda shares, _, n: Deadline(clock, 13.0, "capture"))
    args = ["experiment=tiny_test", "time_budget.minutes=1.5", f"paths.datasets_dir={tmp_path}"]
    ds = Manifest.read_complete(extract(compose("extract", args)))
    assert ds is not None
    cut = ds.provenance["budget_cut"]
    assert ds.num_samples == cut["samples"] == 12 and cut["rendered_samples"] == 40  # tiny_test's 40 samples
    assert "12 of 40 samples captured" in cut["capture"] and cut["regeneration"] is None
    assert ds.val_ids and set(ds.val_ids) <= set(ds.sample_ids)
    assert 1 <= len(ds.val_ids) <= 6  # val_fraction 0.3 of 12, spread through the order
    assert ds.vocabs and ds.token_freq
    assert ds.provenance["extract_seconds"] > 0
    capsys.readouterr()
    again = Manifest.read_complete(extract(compose("extract", args)))
    assert again is not None and again.sample_ids == ds.sample_ids
    assert "cut short by a time budget at 12 of 40" in capsys.readouterr().err


def test_an_online_dataset_records_its_cut_as_a_stored_one_does(tmp_path, monkeypatch):
    """extract.py train.hidden_states=online whose regeneration deadline passes after the first
    batch: the token dataset holds what was answered in time, and provenance.budget_cut has the
    stored dataset's fields (one shape for both kinds of dataset)."""
    monkeypatch.setattr(time_budget, "regen_deadline", lambda shares, clock: ScriptedDeadline([1e6, 0.0]))
    args = [
        "experiment=tiny_test",
        "train.hidden_states=online",
        "data.regenerate=true",
        "data.regen_backend=hf",
        "data.regen_max_tokens=4",
        "data.regen_batch_size=8",
        f"paths.datasets_dir={tmp_path}",
        f"paths.cache_dir={tmp_path / 'cache'}",
    ]
    ds = Manifest.read_complete(extract(compose("extract", args)))
    assert ds is not None and ds.hidden_states == "online"
    cut = ds.provenance["budget_cut"]
    assert set(cut) == {"planned_conversations", "rendered_samples", "regeneration", "capture", "samples"}
    assert cut["planned_conversations"] == 40 and cut["capture"] is None
    assert "8 conversations regenerated" in cut["regeneration"]
    assert ds.num_samples == cut["samples"] == cut["rendered_samples"] <= 8


def test_the_first_batch_runs_even_past_the_deadline(smollm2_dir, tmp_path):
    """A share used up before regeneration began (the engine's start, prompts written) still answers
    one batch: a budgeted dataset with nothing answered would end the run with no data at all."""
    regen, data = _regenerate(smollm2_dir, tmp_path / "d", ScriptedDeadline([0.0, 0.0]))
    assert regen.generated == 4 and len(data.train) + len(data.val) == 4
    assert "4 conversations regenerated" in (data.report.deadline_stop or "")
