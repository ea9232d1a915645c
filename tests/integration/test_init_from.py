"""train.init_from: a head trained and exported by train.py warm-starts another run (from its
export directory or a hub id of it), exactly; a head that does not fit is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import compose
from helpers import TINY, add_hub_snapshot
from safetensors.torch import load_file, save_file

from eagle3.stages.train import run as train
from eagle3.stages.train_inputs import find_dataset
from eagle3.store import HiddenStateDataset
from eagle3.target_model.hub import HubError
from eagle3.target_model.resolve import load_target_head_weights, resolve_target
from eagle3.training.builder import build_head
from eagle3.training.init_from import InitFromError
from eagle3.training.step_path import resolve_step_path


@pytest.fixture(scope="module")
def trained(tiny_run_dir) -> dict:
    """A head trained for tiny_test's 6 steps by train.py, and its export."""
    summary = json.loads((tiny_run_dir / "summary.json").read_text())
    return {"summary": summary, "export": Path(summary["export_dir"])}


def _target_lm_head() -> torch.Tensor:
    cfg = compose("train", TINY)
    return load_target_head_weights(resolve_target(cfg.model, cfg.paths.cache_dir))["lm_head"].float()


def _build(datasets_dir: Path, extra: list[str]):
    cfg = compose("train", TINY + [f"paths.datasets_dir={datasets_dir}"] + extra)
    target_dir = resolve_target(cfg.model, cfg.paths.cache_dir)
    return build_head(
        cfg.head,
        cfg.train,
        cfg.model,
        target_dir,
        HiddenStateDataset(find_dataset(cfg, target_dir)),
        attention=resolve_step_path(cfg.train, cfg.topology).attention,
        target=str(target_dir),
        num_speculative_tokens=cfg.eval.num_draft_tokens,
    )


def _assert_holds_export(head, export: Path) -> None:
    saved = load_file(str(export / "model.safetensors"))
    state = head.state_dict()
    for name, tensor in saved.items():
        expected = tensor.float() if tensor.is_floating_point() else tensor
        assert torch.equal(state[name], expected), name


def test_build_head_loads_the_export_before_any_step(datasets_dir, trained, capsys):
    export = trained["export"]
    fresh, _ = _build(datasets_dir, [])
    head, meta = _build(datasets_dir, [f"train.init_from={export}"])  # init_lm_head_from_target=true as well
    _assert_holds_export(head, export)
    # the trained weights, not a fresh head's: fc and lm_head (init_from wins over the target's rows)
    assert not torch.equal(head.fc.weight, fresh.fc.weight)
    assert not torch.equal(head.lm_head.weight, fresh.lm_head.weight)
    # the frozen target pieces still come from the target, for the head's vocabulary
    target_ids = torch.arange(head.cfg.draft_vocab_size) + head.d2t
    assert torch.equal(head.target_lm_head.weight, _target_lm_head()[target_ids])
    assert meta.aux_layer_ids == [1, 2, 3]
    assert "keeps the head's draft vocabulary" not in capsys.readouterr().out  # same dataset, same vocabulary


def test_train_py_warm_start_exports_the_same_head_after_zero_steps(datasets_dir, trained, tmp_path):
    """The real train.py path: train.max_steps=0 with init_from trains nothing, so its export is
    the loaded head: bit-equal to the export it started from, and its validation starts where
    the first run ended, below a fresh head's."""
    out = tmp_path / "warm"
    train(
        compose(
            "train",
            TINY + [f"paths.datasets_dir={datasets_dir}", f"train.init_from={trained['export']}", "train.max_steps=0"],
            output_dir=str(out),
        )
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["global_step"] == 0
    again = load_file(str(Path(summary["export_dir"]) / "model.safetensors"))
    saved = load_file(str(trained["export"] / "model.safetensors"))
    assert again.keys() == saved.keys()
    for name in saved:
        assert torch.equal(again[name], saved[name]), name
    assert summary["initial"]["val/loss"] < trained["summary"]["initial"]["val/loss"]


def test_a_head_that_does_not_fit_is_refused_by_field(datasets_dir, trained):
    export = trained["export"]
    with pytest.raises(
        InitFromError,
        match=r"num_hidden_layers: expected 2 \(head.num_draft_layers\), got 1; "
        r".*fc_norm: expected True \(head.fc_norm\), got False",
    ):
        _build(datasets_dir, [f"train.init_from={export}", "head.num_draft_layers=2", "head.fc_norm=true"])
    with pytest.raises(InitFromError, match=r"draft_vocab_size: expected 1024 \(head.draft_vocab_size\), got 2048"):
        _build(datasets_dir, [f"train.init_from={export}", "head.draft_vocab_size=1024"])
    with pytest.raises(InitFromError, match=r"intermediate_size: expected 96 \(head.intermediate_size\), got 128"):
        _build(datasets_dir, [f"train.init_from={export}", "head.intermediate_size=96"])
    with pytest.raises(InitFromError, match=r"has no config.json or model.safetensors \(expected an EAGLE-3 head"):
        _build(datasets_dir, [f"train.init_from={export.parent}"])  # the run dir, not its export


def test_a_head_with_another_draft_vocabulary_keeps_its_own(datasets_dir, trained, tmp_path, capsys):
    """The head's lm_head rows belong to its vocabulary: a head whose d2t/t2d differ from the
    dataset's keeps them (the frozen target rows follow), and the run says so with coverages."""
    other = tmp_path / "other_vocab"
    shutil.copytree(trained["export"], other)
    weights = load_file(str(other / "model.safetensors"))
    t2d = weights["t2d"].clone()
    dropped, added = int(t2d.nonzero()[-1]), int((~t2d).nonzero()[0])  # swap one token for another
    t2d[dropped], t2d[added] = False, True
    target_ids = t2d.nonzero().squeeze(1)
    weights["t2d"], weights["d2t"] = t2d, target_ids - torch.arange(target_ids.numel())
    save_file(weights, str(other / "model.safetensors"), metadata={"format": "pt"})

    head, _ = _build(datasets_dir, [f"train.init_from={other}"])
    assert torch.equal(head.t2d, t2d) and torch.equal(head.d2t, weights["d2t"])
    _assert_holds_export(head, other)
    assert torch.equal(head.target_lm_head.weight, _target_lm_head()[target_ids])
    assert (
        "keeps the head's draft vocabulary (1 of its 2048 tokens are not in the dataset's)" in capsys.readouterr().out
    )


def test_init_from_a_hub_id_at_a_revision(datasets_dir, trained, tmp_path, monkeypatch):
    """A hub id resolves through the same resolver as model.path (offline, the local cache)."""
    hub = tmp_path / "hub"
    snap = add_hub_snapshot(hub, "my-org/tiny-head", "d" * 40, trained["export"], ("v1",))  # no main branch
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    head, _ = _build(datasets_dir, ["train.init_from=my-org/tiny-head", "train.init_from_revision=v1"])
    _assert_holds_export(head, snap)
    with pytest.raises(HubError, match=r"train.init_from='my-org/tiny-head' \(revision main\) is not in the hub cache"):
        _build(datasets_dir, ["train.init_from=my-org/tiny-head"])
