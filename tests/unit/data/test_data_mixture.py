"""data.mixture: conversations drawn from several sources by weight (seeded), each tagged with
its source, the counts per source in the dataset's manifest, the mixture in the dataset's
identity, typos refused at compose; the time budget sizing a mixture as a whole. JSONL files
written here. extract.py's counts and SmolLM2's self-prompts: integration/test_data_mixture_extract.py."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import compose
from helpers import two_source_mixture_args, write_word_chats

from eagle3.config.schema import run_config
from eagle3.data.loaders import LoadReport
from eagle3.data.mixture import Mixture, source_of
from eagle3.extraction.identity import fingerprint_inputs
from eagle3.planning import time_budget
from eagle3.stages.narrow import dataset_identity

TINY = ["experiment=tiny_test"]


def _entries(tmp_path: Path, weights: dict[str, float], n: int = 3000, **caps: int) -> list[dict]:
    return [
        {
            "name": name,
            "source": "jsonl",
            "path": str(write_word_chats(tmp_path / f"{name}.jsonl", n, name)),
            "weight": w,
        }
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


def test_the_mixture_names_the_dataset(tmp_path, tiny_model_dir):
    def inputs(*args: str) -> dict:
        return fingerprint_inputs(dataset_identity(run_config(compose("extract", list(args))), str(tiny_model_dir)))

    base = inputs(*two_source_mixture_args(tmp_path, 1))
    assert inputs(*two_source_mixture_args(tmp_path, 2)) != base  # a weight
    sources = base["data"]["mixture"]
    assert [s["name"] for s in sources] == ["a", "b"] and all(s["content_sha"] for s in sources)
    assert "path" not in sources[0] and "source" not in base["data"]  # content, not places
    write_word_chats(tmp_path / "b.jsonl", 60, "gamma")  # one source's content
    assert inputs(*two_source_mixture_args(tmp_path, 1)) != base
    # a config without a mixture keeps the fingerprint it had before the option
    plain = inputs(*TINY, "data=jsonl", f"data.path={tmp_path / 'a.jsonl'}", f"paths.datasets_dir={tmp_path}")
    assert "mixture" not in plain["data"]


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
