"""The export directory's owner (eagle3/serving/export_dir.py) writing over what is there, through
`python export.py`'s stage: a re-export keeps what it did not write (a W&B run above all), a
symlinked out is written through, the card keeps the trained K apart from the served one. A tiny
head's checkpoint, no target, no vLLM (a full disk in a subprocess: integration/test_export_full_disk.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import tiny_head_checkpoint

from eagle3.config.cli import ExportCliConfig
from eagle3.draft.export_files import ACCEPTANCE, ACCEPTANCE_PLOT, CARD, ENGINE_LOGS, META, WANDB, WEIGHTS
from eagle3.draft.serving_format import ExportDirError
from eagle3.stages.export import run as export_run


def _export(ckpt: Path, out: Path, k: int | None = None) -> str:
    return export_run(ExportCliConfig(ckpt=str(ckpt), out=str(out), num_draft_tokens=k))


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _wandb_run(export: Path) -> Path:
    """A real offline W&B run in the export, as `python evaluate.py logger.backend=wandb` leaves one."""
    import wandb

    run = wandb.init(project="eagle3-test", mode="offline", dir=str(export), reinit="create_new")
    run.log({"eval/mean_acceptance_length": 1.7})
    run.finish()
    wandb.teardown()  # its service done writing (its logs are appended to after finish)
    (found,) = (export / WANDB).glob("offline-run-*")
    return found


# ---- S4: a re-export keeps what it did not write; never deletes an unsynced W&B run


def test_a_re_export_of_other_weights_keeps_the_wandb_run_and_moves_the_measurements_aside(tmp_path, capsys):
    out = tmp_path / "export"
    _export(tiny_head_checkpoint(tmp_path / "a.ckpt", seed=0), out)
    wandb_run = _wandb_run(out)
    (out / ACCEPTANCE).write_text(json.dumps({"mean_acceptance_length": 1.7}))
    (out / ACCEPTANCE_PLOT).write_bytes(b"\x89PNG of head a")
    (out / ENGINE_LOGS).mkdir()
    (out / ENGINE_LOGS / "engine-with-head.log").write_text("head a's engine")
    before = _files(out)
    capsys.readouterr()

    _export(tiny_head_checkpoint(tmp_path / "b.ckpt", seed=1), out)  # other weights, same place
    printed = capsys.readouterr().out
    # the W&B run where its `wandb sync` names it, byte for byte (symlinks such as latest-run kept)
    run_files = {n: b for n, b in before.items() if n.startswith(f"{WANDB}/")}
    assert run_files and {n: b for n, b in _files(out).items() if n.startswith(f"{WANDB}/")} == run_files
    assert (out / WANDB / "latest-run").is_symlink() == (wandb_run.parent / "latest-run").is_symlink()
    # head a's measurements do not describe head b: beside the export, named in the output, whole
    (aside,) = tmp_path.glob("export.previous-*")
    assert f"moved to {aside}" in printed
    moved = _files(aside)
    assert moved == {n: b for n, b in before.items() if n.split("/")[0] in (ACCEPTANCE, ACCEPTANCE_PLOT, ENGINE_LOGS)}
    assert not (out / ACCEPTANCE).exists() and not (out / ACCEPTANCE_PLOT).exists()
    assert "Not measured yet for these weights" in (out / CARD).read_text()
    assert out / WEIGHTS and before[WEIGHTS] != (out / WEIGHTS).read_bytes()


def test_a_re_export_of_the_same_weights_keeps_everything_in_place(tmp_path):
    out, ckpt = tmp_path / "export", tiny_head_checkpoint(tmp_path / "a.ckpt")
    _export(ckpt, out)
    _wandb_run(out)
    (out / ACCEPTANCE_PLOT).write_bytes(b"\x89PNG")
    (out / ENGINE_LOGS).mkdir()
    (out / ENGINE_LOGS / "engine.log").write_text("log")
    before = _files(out)
    _export(ckpt, out, k=5)  # the same checkpoint at another K
    after = _files(out)
    kept = [n for n in before if n.split("/")[0] in (WANDB, ACCEPTANCE_PLOT, ENGINE_LOGS)]
    assert kept and all(after[n] == before[n] for n in kept)
    assert not list(tmp_path.glob("export.previous-*"))


# ---- S5: out= a symlink to an export


def test_an_export_through_a_symlink_is_written_whole_into_its_target(tmp_path, capsys):
    target = tmp_path / "runs" / "one" / "export"
    _export(tiny_head_checkpoint(tmp_path / "a.ckpt", seed=0), target)
    link = tmp_path / "latest"
    link.symlink_to(target)
    printed = _export(tiny_head_checkpoint(tmp_path / "b.ckpt", seed=1), link)
    assert printed == str(target) and f"out={link} is a symlink: exported into {target}" in capsys.readouterr().out
    assert link.is_symlink() and link.resolve() == target  # the link kept, pointing at the new export
    assert {CARD, META, WEIGHTS} <= set(os.listdir(target))  # whole: card and record beside the weights
    assert not [n for n in os.listdir(target.parent) if ".tmp-" in n]


def test_a_dangling_symlink_out_is_refused_naming_it_and_its_target(tmp_path):
    link = tmp_path / "latest"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(ExportDirError) as e:
        _export(tiny_head_checkpoint(tmp_path / "a.ckpt"), link)
    assert f"out={link} is a symlink to {tmp_path / 'gone'}, which is nothing" in str(e.value)
    assert link.is_symlink() and not (tmp_path / "gone").exists()
    assert sorted(os.listdir(tmp_path)) == ["a.ckpt", "latest"]


# ---- S12: the card's trained K is the training's, not the re-export's


def test_the_card_keeps_the_trained_k_apart_from_the_served_one(tmp_path):
    run_dir = tmp_path / "run"
    ckpt = tiny_head_checkpoint(run_dir / "checkpoints" / "last.ckpt", num_draft_tokens=3)
    (run_dir / "summary.json").write_text(json.dumps({"global_step": 6, "best_checkpoint": str(ckpt)}))
    out = Path(_export(ckpt, tmp_path / "export", k=5))
    rows = {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in (out / CARD).read_text().splitlines()
        if line.startswith("| ")
    }
    assert rows["trained draft tokens (K)"] == "3"
    assert rows["served draft tokens (K, config.json)"] == "5"
    assert json.loads((out / META).read_text())["training"]["run"]["num_draft_tokens"] == 3
