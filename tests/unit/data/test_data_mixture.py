"""data.mixture: conversations drawn from several sources by weight (seeded), each tagged with
its source, the counts per source in the dataset's manifest, the mixture in the dataset's
identity, typos refused at compose; self-prompts written and answered by the real SmolLM2; the
time budget sizing a mixture as a whole. JSONL files written here, a tiny random Llama for the
extraction."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT, compose

from eagle3.config.schema import run_config
from eagle3.data.conversation import conversation_of
from eagle3.data.loaders import LoadReport
from eagle3.data.mixture import Mixture, source_of
from eagle3.extraction.identity import fingerprint_inputs
from eagle3.planning import time_budget
from eagle3.stages.narrow import dataset_identity
from eagle3.store import Manifest

TINY = ["experiment=tiny_test"]


def _chats(path: Path, n: int, word: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "id": f"{i}",
            "messages": [{"role": "user", "content": f"{word} {i}?"}, {"role": "assistant", "content": "ok"}],
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _entries(tmp_path: Path, weights: dict[str, float], n: int = 3000, **caps: int) -> list[dict]:
    return [
        {"name": name, "source": "jsonl", "path": str(_chats(tmp_path / f"{name}.jsonl", n, name)), "weight": w}
        | ({"max_samples": caps[name]} if name in caps else {})
        for name, w in weights.items()
    ]


def _draw(entries: list[dict], seed: int, n: int) -> list[str]:
    stream = Mixture(entries, seed, regenerate=False).stream(LoadReport("mixture", ""))
    ids = [c.id for c, _ in zip(stream, range(n))]
    stream.close()
    return ids


def test_draws_follow_the_weights_seeded_and_tagged(tmp_path):
    entries = _entries(tmp_path, {"a": 5, "b": 3, "c": 2})
    ids = _draw(entries, seed=7, n=2000)
    share = {k: n / len(ids) for k, n in Counter(source_of(i) for i in ids).items()}
    assert share == pytest.approx({"a": 0.5, "b": 0.3, "c": 0.2}, abs=0.03)
    assert ids == _draw(entries, seed=7, n=2000)  # the same seed, the same draws
    assert ids[:500] == _draw(entries, seed=7, n=500)  # more samples only add draws
    assert ids != _draw(entries, seed=8, n=2000)
    # each source in its own file order, its ids tagged "<source>/<id>"
    assert [i for i in ids if i.startswith("b/")][:3] == ["b/0", "b/1", "b/2"]


def test_a_capped_or_empty_source_closes_and_the_others_share_its_draws(tmp_path):
    entries = _entries(tmp_path, {"a": 1, "b": 1}, n=200, b=20)
    mixture = Mixture(entries, 0, regenerate=False)
    report = LoadReport("mixture", "")
    ids = [c.id for c in mixture.stream(report)]
    assert Counter(source_of(i) for i in ids) == {"a": 200, "b": 20}
    assert mixture.report.sources["b"].closed == "max_samples=20 reached"
    assert mixture.report.sources["a"].closed == "ran out" and report.usable == 220
    with pytest.raises(Exception, match=r"self_prompts are user turns only.*data.regenerate=true"):
        Mixture([{"name": "s", "source": "self_prompts"}], 0, regenerate=False)
    with pytest.raises(Exception, match=r"self_prompts never run out: expected data.max_samples"):
        Mixture([{"name": "s", "source": "self_prompts"}], 0, regenerate=True, max_samples=None)
    with pytest.raises(Exception, match=r"data.mixture\[0\] \(a\)\.name: expected a unique"):
        Mixture(entries[:1] * 2, 0, regenerate=False)


def test_a_typo_in_a_source_fails_at_compose():
    for bad, named in (
        ("{name: a, source: sharegpt, wieght: 2}", "wieght"),
        ("{name: a, source: sharegtp}", "sharegtp"),
    ):
        with pytest.raises(Exception) as err:
            compose("extract", ["data=mixture_default", f"data.mixture=[{bad}]"])
        assert named in f"{err.value} {err.value.__cause__}"
    cfg = run_config(compose("extract", ["data=mixture_default"]))
    assert [(e.name, e.source.value, e.weight) for e in cfg.data.mixture] == [
        ("sharegpt", "sharegpt", 0.75),
        ("self", "self_prompts", 0.25),
    ]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from eagle3.target_model.resolve import resolve_target

    return Path(resolve_target(compose("extract", TINY).model, ROOT / ".cache"))


def _mix_args(tmp_path: Path, weight_b: float) -> list[str]:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path, word in ((a, "alpha"), (b, "beta")):
        if not path.exists():  # the test may have rewritten one
            _chats(path, 60, word)
    mixture = f"[{{name: a, source: jsonl, path: '{a}', weight: 3}}, {{name: b, source: jsonl, path: '{b}', weight: {weight_b}}}]"
    return [*TINY, "data=jsonl", "data.path=null", f"data.mixture={mixture}", f"paths.datasets_dir={tmp_path / 'data'}"]


def test_the_mixture_names_the_dataset(tmp_path, model_dir):
    def inputs(*args: str) -> dict:
        return fingerprint_inputs(dataset_identity(run_config(compose("extract", list(args))), str(model_dir)))

    base = inputs(*_mix_args(tmp_path, 1))
    assert inputs(*_mix_args(tmp_path, 2)) != base  # a weight
    sources = base["data"]["mixture"]
    assert [s["name"] for s in sources] == ["a", "b"] and all(s["content_sha"] for s in sources)
    assert "path" not in sources[0] and "source" not in base["data"]  # content, not places
    _chats(tmp_path / "b.jsonl", 60, "gamma")  # one source's content
    assert inputs(*_mix_args(tmp_path, 1)) != base
    # a config without a mixture keeps the fingerprint it had before the option
    plain = inputs(*TINY, "data=jsonl", f"data.path={tmp_path / 'a.jsonl'}", f"paths.datasets_dir={tmp_path}")
    assert "mixture" not in plain["data"]


def test_extract_prints_and_records_the_counts_per_source(tmp_path, model_dir):
    run = subprocess.run(
        [sys.executable, "extract.py", *_mix_args(tmp_path, 1)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "source a" in run.stderr and "source b" in run.stderr
    manifest = Manifest.read(Path(run.stdout.strip().splitlines()[-1]))
    counts = manifest.provenance["mixture"]
    assert set(counts) == {"a", "b"} and counts["a"]["weight"] == pytest.approx(0.75)
    assert manifest.num_samples == 40  # tiny_test's data.max_samples, over both sources
    assert Counter(source_of(i) for i in manifest.sample_ids) == {k: v["samples"] for k, v in counts.items()}
    assert Counter(source_of(i) for i in manifest.val_ids) == {k: v["val"] for k, v in counts.items() if v["val"]}
    assert counts["a"]["samples"] > counts["b"]["samples"] > 0

    # the dataset's validation prompts: its samples' served prompts (a mixture's self-written user
    # turns live in no chat file), each the opening turn of the conversation its id names
    from transformers import AutoTokenizer

    from eagle3.evaluation.prompts import heldout_prompts

    dataset_dir = Path(run.stdout.strip().splitlines()[-1])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    got = heldout_prompts(dataset_dir, max_prompts=50, humaneval_prompts=0, tokenizer=tokenizer)
    val_conversations = list(dict.fromkeys(conversation_of(i) for i in manifest.val_ids))
    assert [p.id for p in got.prompts] == val_conversations and all(p.source == "val" for p in got.prompts)
    for p in got.prompts:
        name, number = p.id.split("/")
        word = "alpha" if name == "a" else "beta"
        opening = [{"role": "user", "content": f"{word} {number}?"}]
        text = tokenizer.apply_chat_template(opening, add_generation_prompt=True, tokenize=False)
        assert p.token_ids == tokenizer(text, add_special_tokens=False)["input_ids"], p.id


def _shares(*more: str) -> time_budget.TimeShares:
    args = ["experiment=smollm2_budget", *more]
    split = time_budget.time_shares(run_config(compose("extract", args)))
    assert split is not None
    return split


def test_the_budget_sizes_a_mixture_as_a_whole():
    one = _shares()
    mix = _shares("data=mixture_default")
    assert not one.by_source and one.prompt_s == 0
    names = dict(mix.by_source)
    assert sum(names.values()) == mix.conversations and names["self"] == pytest.approx(0.25 * mix.conversations, abs=1)
    assert mix.prompt_s > 0 and "data.mixture: sharegpt" in "\n".join(mix.lines())
    # longer self-prompts cost more generation: fewer conversations fit the same minutes
    longer = _shares("data=mixture_default", "data.mixture.1.prompt_max_tokens=400")
    assert longer.prompt_s > mix.prompt_s and longer.conversations < mix.conversations


@pytest.mark.slow
def test_self_prompts_on_smollm2_are_distinct_user_turns_then_answered(smollm2_dir, tmp_path):
    from eagle3.target_model.generate.hf_engine import HFRegenerator
    from eagle3.target_model.generate.self_prompts import SelfPrompts

    regen = HFRegenerator(smollm2_dir, tmp_path, max_tokens=12, max_model_len=256, gen_batch_size=3)
    entry = {"name": "self", "prompt_max_tokens": 16, "topics": ["math", "coding", "history"]}
    stream = iter(SelfPrompts(regen, entry, seed=0, batch_size=3))
    convs = [next(stream) for _ in range(3)]
    stream.close()
    users = [c.messages[0]["content"] for c in convs]
    assert all(u.strip() for u in users) and len(set(users)) == 3, users
    again = iter(SelfPrompts(regen, entry, seed=0, batch_size=3))  # read back from the cache: the same
    assert [next(again).messages[0]["content"] for _ in range(3)] == users
    answered = regen(convs)
    for conv, user in zip(answered, users):
        assert [m["role"] for m in conv.messages] == ["user", "assistant"]
        assert conv.messages[0]["content"] == user and conv.messages[1]["content"].strip()
