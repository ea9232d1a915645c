"""The vLLM acceptance evaluation: held-out prompts, counter arithmetic, report files, W&B.
A random-init head measured by a real vLLM engine: integration/vllm/test_evaluate_vllm.py."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import VAL_SPLIT_CONVERSATIONS, write_dataset_with_val_split

from eagle3.evaluation.counters import CounterError, SpecDecodeCounters, counters_from_histograms
from eagle3.evaluation.engine_io import BatchResult
from eagle3.evaluation.export_info import ExportError, read_export
from eagle3.evaluation.figures import consistency_problems, figures_of, prompt_outcomes
from eagle3.evaluation.plot import save_acceptance_plot
from eagle3.evaluation.prompts import HUMANEVAL_INSTRUCTION, PromptError, heldout_prompts, humaneval_tasks
from eagle3.evaluation.report import AcceptanceReport, write_json
from eagle3.evaluation.wandb_log import log_report
from eagle3.store import Manifest

K = 3


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def _served_prompt(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------ prompts


def test_val_prompts_are_the_opening_turns_of_the_split_in_order(tmp_path, tokenizer):
    ds = write_dataset_with_val_split(tmp_path / "ds", ["c1", "c3", "c4", "c5"], tokenizer)
    got = heldout_prompts(ds, max_prompts=3, humaneval_prompts=0, tokenizer=tokenizer, max_prompt_tokens=256)
    assert [(p.source, p.id) for p in got.prompts] == [("val", "c1"), ("val", "c3"), ("val", "c5")]
    # system + first user turn only; later turns and all answers are left out
    assert got.prompts[0].messages == VAL_SPLIT_CONVERSATIONS[1]["messages"][:2]
    assert got.prompts[1].messages == VAL_SPLIT_CONVERSATIONS[3]["messages"][:1]
    for p in got.prompts:
        assert p.token_ids == _served_prompt(tokenizer, p.messages)
        assert tokenizer.decode(p.token_ids).endswith("<|im_start|>assistant\n")
    assert got.skipped_too_long == {"val": 1}  # c4: 600 words > 256 tokens, skipped not cut
    assert got.counts() == {"broad": 0, "math_word": 0, "val": 3, "humaneval": 0} and not got.notes


def test_val_prompts_are_checked_by_content_against_the_dataset(tmp_path, tokenizer):
    """An id-less JSONL edited after extraction (one conversation added at its top): its ids are
    line positions, so "chats:1" now names another conversation. That used to be evaluated
    without a word; it is refused, naming the file, the id, expected and got. Regenerated
    answers (other assistant turns than the file's) are no mismatch: the prompt is the same."""
    convs = [{"messages": c["messages"]} for c in VAL_SPLIT_CONVERSATIONS]  # no ids: "chats:<line>"
    regenerated = write_dataset_with_val_split(
        tmp_path / "regen", ["chats:1", "chats:3"], tokenizer, convs, "Regenerated."
    )
    got = heldout_prompts(regenerated, max_prompts=2, humaneval_prompts=0, tokenizer=tokenizer)
    assert [p.id for p in got.prompts] == ["chats:1", "chats:3"] and not got.notes
    assert got.prompts[1].messages == VAL_SPLIT_CONVERSATIONS[3]["messages"][:1]

    ds = write_dataset_with_val_split(tmp_path / "ds", ["chats:1", "chats:3"], tokenizer, convs)
    chats = ds / "chats.jsonl"
    added = {"messages": [{"role": "user", "content": "A new first line."}, {"role": "assistant", "content": "Ok."}]}
    chats.write_text(json.dumps(added) + "\n" + chats.read_text())
    with pytest.raises(PromptError) as e:
        heldout_prompts(ds, max_prompts=2, humaneval_prompts=0, tokenizer=tokenizer)
    msg = str(e.value)
    assert msg.startswith(f"{chats}: validation conversation 'chats:1': its opening turn as read now is not the prompt")
    assert f"the dataset {ds} stored for it (sample 'chats:1')" in msg
    assert "expected " in msg and "You answer briefly." in msg  # c1's system turn, as stored
    assert "got " in msg and "What is a hash map?" in msg  # c0's, now on line 1
    assert "the chat data changed since extraction" in msg


def test_a_manifest_alone_is_checked_by_the_chat_files_content_hash(tmp_path, tokenizer):
    """Without the dataset's sample files (its manifest copied alone) the prompts cannot be
    checked one by one: the chat file as a whole must be the one extracted from."""
    ds = write_dataset_with_val_split(tmp_path / "ds", ["c1", "c3"])
    got = heldout_prompts(ds, max_prompts=2, humaneval_prompts=0, tokenizer=tokenizer)
    assert [p.id for p in got.prompts] == ["c1", "c3"] and not got.notes
    chats = ds / "chats.jsonl"
    recorded = Manifest.read(ds).fingerprint_inputs["data"]["content_sha"]
    chats.write_text(chats.read_text().replace("Name three primary colors.", "Name three animals."))
    with pytest.raises(PromptError) as e:
        heldout_prompts(ds, max_prompts=2, humaneval_prompts=0, tokenizer=tokenizer)
    msg = str(e.value)
    assert msg.startswith(f"{chats}: content_sha: expected {recorded} (the chat data ")
    assert "got " in msg and "the dataset's samples cannot be read" in msg and "changed since extraction" in msg


def test_short_split_and_missing_ids_are_reported(tmp_path, tokenizer):
    ds = write_dataset_with_val_split(tmp_path / "ds", ["c3"], tokenizer)
    got = heldout_prompts(ds, max_prompts=4, humaneval_prompts=2, tokenizer=tokenizer)
    assert got.counts() == {"broad": 0, "math_word": 0, "val": 1, "humaneval": 2}  # not refilled with HumanEval
    assert any("val: 1 of 2" in n for n in got.notes)
    gone = write_dataset_with_val_split(tmp_path / "gone", ["c3", "not-in-the-file"])
    with pytest.raises(PromptError, match="not found in the chat source"):
        heldout_prompts(gone, max_prompts=4, humaneval_prompts=0, tokenizer=tokenizer)


def test_humaneval_prompts_come_from_the_package_file(tokenizer):
    tasks = humaneval_tasks()
    assert len(tasks) == 164 and tasks[0][0] == "HumanEval/0" and tasks[163][0] == "HumanEval/163"
    got = heldout_prompts(None, max_prompts=2, humaneval_prompts=2, tokenizer=tokenizer)
    assert [p.id for p in got.prompts] == ["HumanEval/0", "HumanEval/1"]
    text = got.prompts[0].messages[0]["content"]
    assert text.startswith(HUMANEVAL_INSTRUCTION) and "def has_close_elements(numbers: List[float]" in text
    assert got.prompts[0].token_ids == _served_prompt(tokenizer, got.prompts[0].messages)
    with pytest.raises(PromptError, match="no held-out prompts"):
        heldout_prompts(None, max_prompts=2, humaneval_prompts=0, tokenizer=tokenizer)


def test_export_finds_its_target_and_dataset_from_relative_paths(tmp_path, monkeypatch):
    """train.py records paths relative to where it ran (<project>/.cache/..., <project>/data/...);
    the evaluation finds them from the export's location, wherever it is started from."""
    project = tmp_path / "project"
    target = project / ".cache" / "targets" / "t"
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (project / "data" / "ds").mkdir(parents=True)
    (project / "data" / "ds" / "manifest.json").write_text("{}")
    export = project / "outputs" / "train" / "runs" / "r1" / "export"
    export.mkdir(parents=True)
    (export / "model.safetensors").write_bytes(b"")
    config = {
        "speculators_model_type": "eagle3",
        "eagle_aux_hidden_state_layer_ids": [2, 15, 27],
        "draft_vocab_size": 8,
        "speculators_config": {"verifier": {"name_or_path": ".cache/targets/t"}},
    }
    (export / "config.json").write_text(json.dumps(config))
    (export.parent / "summary.json").write_text(json.dumps({"dataset_dir": "data/ds"}))
    monkeypatch.chdir(tmp_path)  # not the project root
    info = read_export(export)
    assert Path(info.target) == target.resolve() and info.dataset_dir == (project / "data" / "ds").resolve()
    assert info.aux_layer_ids == [2, 15, 27]
    config["speculators_config"]["verifier"]["name_or_path"] = ".cache/targets/gone"
    (export / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match="verifier.name_or_path='.cache/targets/gone'"):
        read_export(export)
    assert read_export(export, target=str(target)).target == str(target.resolve())
    config["speculators_model_type"] = "eagle"
    (export / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match="expected 'eagle3'"):
        read_export(export, target=str(target))


# ------------------------------------------------------------------ counters and figures


@dataclass
class _Metric:  # the shape of vllm.v1.metrics.reader.Counter / Vector
    name: str
    labels: dict = field(default_factory=dict)
    value: int = 0
    values: list = field(default_factory=list)


def _snapshot(drafts, draft_tokens, accepted, per_pos, engines=1):
    out = [_Metric("vllm:num_requests_running", value=3)]
    for e in range(engines):
        lab = {"engine": str(e)}
        out += [
            _Metric("vllm:spec_decode_num_drafts", lab, drafts),
            _Metric("vllm:spec_decode_num_draft_tokens", lab, draft_tokens),
            _Metric("vllm:spec_decode_num_accepted_tokens", lab, accepted),
            _Metric("vllm:spec_decode_num_accepted_tokens_per_pos", lab, values=per_pos),
        ]
    return out


def test_counter_differences_give_acceptance_length_and_per_position_rates():
    before = SpecDecodeCounters.from_metrics(_snapshot(10, 30, 12, [6, 4, 2]), K)
    after = SpecDecodeCounters.from_metrics(_snapshot(110, 330, 112, [66, 34, 12]), K)
    batch = after - before
    assert (batch.drafts, batch.draft_tokens, batch.accepted_tokens) == (100, 300, 100)
    assert batch.mean_acceptance_length == pytest.approx(2.0)  # 1 + 100/100
    assert batch.per_position_acceptance_rate == pytest.approx([0.6, 0.3, 0.1])
    assert batch.acceptance_rate == pytest.approx(100 / 300)
    assert batch.inconsistencies(K) == []
    # two engines' label sets add up; a short vector (positions registered lazily) is padded
    both = SpecDecodeCounters.from_metrics(_snapshot(5, 15, 3, [3], engines=2), K)
    assert (both.drafts, both.accepted_per_position) == (10, [6, 0, 0])
    with pytest.raises(CounterError, match="went down"):
        before - after
    with pytest.raises(CounterError, match="num_speculative_tokens=3"):
        SpecDecodeCounters.from_metrics(_snapshot(1, 4, 0, [0, 0, 0, 0]), K)
    assert math.isnan(SpecDecodeCounters(accepted_per_position=[0] * K).mean_acceptance_length)


def test_histograms_rebuild_the_counters_and_disagreement_is_flagged():
    # per request h[j] = verify steps that accepted j drafts
    hists = [[2, 1, 0, 1], [0, 0, 2, 0]]
    rebuilt = counters_from_histograms(hists, K)
    assert (rebuilt.drafts, rebuilt.accepted_tokens, rebuilt.accepted_per_position) == (6, 8, [4, 3, 1])
    good = BatchResult("val", [[1, 2], [3]], 1.0, SpecDecodeCounters(6, 18, 8, [4, 3, 1]).to_dict(), hists)
    assert consistency_problems(good, K) == []
    bad = BatchResult("val", [[1, 2], [3]], 1.0, SpecDecodeCounters(6, 18, 7, [4, 2, 1]).to_dict(), hists)
    assert any(
        "accepted_tokens from per-request histograms 8 != from counters 7" in p for p in consistency_problems(bad, K)
    )


def _synthetic_report(tmp_path) -> AcceptanceReport:
    """Engine results as the engine process returns them (two sources, both engines)."""
    val_h = BatchResult(
        "val",
        [[5, 6, 7, 8], [9, 9]],
        2.0,
        SpecDecodeCounters(4, 12, 2, [2, 0, 0]).to_dict(),
        [[2, 2, 0, 0], [0, 0, 0, 0]],
    )
    val_b = BatchResult("val", [[5, 6, 7, 8], [9, 8]], 3.0)
    he_h = BatchResult("humaneval", [[1, 2, 3]], 1.0, SpecDecodeCounters(2, 6, 3, [2, 1, 0]).to_dict(), [[0, 1, 1, 0]])
    he_b = BatchResult("humaneval", [[1, 2, 3]], 1.5)
    by_source = {"val": figures_of([val_h], [val_b], K), "humaneval": figures_of([he_h], [he_b], K)}
    overall = figures_of([val_h, he_h], [val_b, he_b], K)
    per_prompt = prompt_outcomes(val_h, val_b, ["a", "b"], [10, 11]) + prompt_outcomes(
        he_h, he_b, ["HumanEval/0"], [12]
    )
    return AcceptanceReport(
        str(tmp_path / "export"),
        "/target",
        K,
        32,
        overall,
        by_source,
        {"val": 2, "humaneval": 1},
        per_prompt=per_prompt,
    )


def test_figures_per_source_and_overall(tmp_path):
    r = _synthetic_report(tmp_path)
    assert r.by_source["val"].mean_acceptance_length == pytest.approx(1.5)
    assert r.by_source["humaneval"].mean_acceptance_length == pytest.approx(2.5)
    assert r.overall.mean_acceptance_length == pytest.approx(1 + 5 / 6)  # pooled counters, not a mean of means
    assert r.overall.per_position_acceptance_rate == pytest.approx([4 / 6, 1 / 6, 0])
    assert r.overall.tokens_per_s_with_head == pytest.approx(9 / 3.0)
    assert r.overall.tokens_per_s_without_head == pytest.approx(9 / 4.5)
    assert r.overall.eval_engines_tok_s_ratio == pytest.approx(1.5)
    assert (r.overall.greedy_matches, r.overall.greedy_match_rate) == (2, pytest.approx(2 / 3))
    assert [p.first_difference for p in r.per_prompt] == [None, 1, None]


def test_json_png_and_wandb_offline_run(tmp_path):
    import wandb

    r = _synthetic_report(tmp_path)
    r.served = {"val": [([1, 2], [3, 4])]}  # the token pairs stay out of the JSON
    r.served_replay = {
        "val": {"replay_accept_len": 1.52, "samples": 2.0},
        "all": {"replay_accept_len": 1.8, "samples": 3.0},
    }
    path = write_json(r, tmp_path / "out")
    data = json.loads(path.read_text())
    assert data["served_replay"]["all"]["replay_accept_len"] == 1.8 and "served" not in data
    for key in (
        "num_draft_tokens",
        "mean_acceptance_length",
        "per_position_acceptance_rate",
        "drafts",
        "draft_tokens",
        "accepted_tokens",
        "prompts",
        "tokens_per_s_with_head",
        "tokens_per_s_without_head",
        "eval_engines_tok_s_ratio",
        "eval_engines_tok_s_ratio_is",
        "interval_method",
        "greedy_match_rate",
        "by_source",
        "measured_by",
    ):
        assert key in data, key
    assert data["prompts"] == {"val": 2, "humaneval": 1}
    # the engines' tok/s ratio under a name that says what it is: no "speedup" to mistake for serving's
    assert "speedup" not in data and "speedup" not in data["by_source"]["val"]
    assert "not a serving figure" in data["eval_engines_tok_s_ratio_is"]
    assert len(data["per_position_acceptance_rate"]) == K
    assert data["by_source"]["humaneval"]["mean_acceptance_length"] == pytest.approx(2.5)
    assert data["greedy_mismatches"] == [{"source": "val", "id": "b", "first_difference": 1}]
    png = save_acceptance_plot(r, tmp_path / "out")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

    run = wandb.init(project="eagle3-test", mode="offline", dir=str(tmp_path), reinit="create_new")
    assert log_report(r, png, run)
    run.finish()
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    logged = _logged_history(run_dir, "eval/mean_acceptance_length")
    assert logged["eval/mean_acceptance_length"] == pytest.approx(1 + 5 / 6)
    assert logged["eval/humaneval/mean_acceptance_length"] == pytest.approx(2.5)
    assert logged["eval/accept_rate_pos0"] == pytest.approx(4 / 6)
    assert logged["eval/eval_engines_tok_s_ratio"] == pytest.approx(1.5) and "eval/speedup" not in logged
    assert logged["eval/served_replay_accept_len"] == pytest.approx(1.8)  # beside eval/mean_acceptance_length
    assert logged["eval/val/served_replay_accept_len"] == pytest.approx(1.52)
    assert logged["eval/acceptance_per_position/_type"] == "table-file"
    assert logged["eval/acceptance_plot/_type"] == "image-file"
    assert list((run_dir / "files" / "media" / "images").rglob("*.png"))


def _logged_history(run_dir: Path, key: str, timeout_s: float = 30.0) -> dict:
    """The offline run's history rows merged, once `key` is in them. wandb's core process
    writes the run file after finish() returns (seen here: 7 bytes right after finish in 2 of
    6 runs), so poll rather than read once."""
    from helpers.wandb_offline import read_run

    deadline = time.monotonic() + timeout_s
    while True:
        merged: dict = {}
        if list(run_dir.glob("run-*.wandb")):
            for row in read_run(run_dir)["history"]:
                merged.update(row)
        if key in merged or time.monotonic() > deadline:
            return merged
        time.sleep(0.2)


# ------------------------------------------------------------------ real vLLM


def test_an_engine_request_survives_its_json_with_the_options_nested():
    """The engine process reads its request from JSON: the options come back an EngineOptions."""
    from eagle3.config.engine import EngineOptions
    from eagle3.evaluation.engine_io import EngineRequest, PromptBatch

    options = EngineOptions(enforce_eager=True, max_num_seqs=4, seed=7, trust_remote_code=True, timeout_s=60)
    request = EngineRequest("m", "h", 3, 16, 256, [PromptBatch("val", [[1, 2]], wave_size=1)], options, 2)
    again = EngineRequest.from_json(request.to_json())
    assert again == request and isinstance(again.options, EngineOptions)
    assert json.loads(request.to_json())["options"]["max_num_seqs"] == 4
