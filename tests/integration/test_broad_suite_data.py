"""The held-out suite never reaches training: its files are package data no data preset or training
code names, and the packaged ShareGPT (read whole) holds none of its turns."""

from __future__ import annotations

from conftest import ROOT

from eagle3.evaluation.suite import SUITE_DIR, read_suite


def test_the_suite_ships_in_the_package_and_never_reaches_training():
    """The suite's files are package data; no data preset or data/extraction code names them; the
    packaged ShareGPT that extract.py renders holds none of their turns."""
    assert '"eagle3.evaluation" = ["suites/*.jsonl"]' in (ROOT / "pyproject.toml").read_text()
    assert SUITE_DIR == ROOT / "eagle3" / "evaluation" / "suites"
    names = ("suites/", "broad.jsonl", "math_word.jsonl")
    for path in [*(ROOT / "conf").rglob("*.yaml"), *(ROOT / "eagle3" / "data").rglob("*.py"),
                 *(ROOT / "eagle3" / "extraction").rglob("*.py"), *(ROOT / "eagle3" / "training").rglob("*.py")]:  # fmt: skip
        text = path.read_text()
        assert not any(n in text for n in names), path
    from eagle3.data.loaders import iter_conversations

    turns = {t for name in ("broad", "math_word") for p in read_suite(name) for t in p.turns}
    seen = 0
    for conv in iter_conversations("sharegpt", None):
        seen += 1
        for m in conv.messages:
            assert not any(t in m["content"] for t in turns), (conv.id, m["content"][:200])
    assert seen > 10_000
