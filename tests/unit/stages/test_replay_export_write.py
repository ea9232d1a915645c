"""replay_export's figures file (``out=``) is written whole or not at all, through the atomic
write helper: a write that fails midway (a full disk) leaves the previous file as it was."""

from __future__ import annotations

import json

import pytest
from helpers import tear_writes

from eagle3.stages.replay_export import write_figures


@pytest.fixture
def torn_writes(monkeypatch):
    tear_writes(monkeypatch)


def test_a_figures_write_that_fails_midway_leaves_the_previous_file(tmp_path, torn_writes):
    out = tmp_path / "figures.json"
    previous = json.dumps({"replay_accept_len": 1.5}, indent=2)
    with open(out, "w") as f:
        f.write(previous)
    with pytest.raises(OSError, match="No space left"):
        write_figures(out, {"replay_accept_len": 2.0, "sim_accept_len": 2.5})
    assert out.read_text() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figures.json"]


def test_the_figures_are_written(tmp_path):
    write_figures(tmp_path / "figures.json", {"replay_accept_len": 2.0})
    assert json.loads((tmp_path / "figures.json").read_text()) == {"replay_accept_len": 2.0}
