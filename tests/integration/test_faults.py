"""SIGKILL at every stage, and a disk that fills up: the real entrypoints run in a subprocess
with EAGLE3_FAULT=<point> (eagle3/util/faults.py), die there, and the rerun ends with what an
uninterrupted run gives (tiny random Llama, real ShareGPT). docs/faults.md lists them."""

from __future__ import annotations

import json
import shutil
import traceback
from pathlib import Path

import pytest
import torch
from conftest import CACHE, compose
from helpers.faults import ARGS, assert_killed, assert_same_dataset, cli, file_bytes, temps
from safetensors.torch import load, load_file

from eagle3.serving.export_dir import write_export
from eagle3.stages.extract import run as extract
from eagle3.stages.train import run as train
from eagle3.store import DiskSpaceError, Manifest, format_bytes
from eagle3.store.merge import merge_parts, part_dir
from eagle3.store.reader import damaged_shards
from eagle3.training.checkpoint_io import checkpoint_head
from eagle3.util import faults


@pytest.fixture(scope="module")
def reference(reference_dataset) -> Path:
    """The dataset of an uninterrupted run."""
    return reference_dataset


def _listed_and_on_disk(ds: Path) -> tuple[set[str], set[str]]:
    listed = {s.file for s in Manifest.read(ds).shards}
    return listed, {p.name for p in ds.glob("shard-*.safetensors")}


@pytest.mark.parametrize("point", ["capture@30", "shard_write@3", "manifest_write@5"])
def test_extraction_killed_resumes_to_the_same_dataset(reference, tmp_path, point):
    killed = cli(["extract.py", *ARGS, f"paths.datasets_dir={tmp_path}"], fault=point)
    assert_killed(killed)
    (ds,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    m = Manifest.read(ds)
    assert not m.complete and 0 < m.num_samples < Manifest.read(reference).num_samples
    assert damaged_shards(ds, m, "full") == []  # whatever the manifest lists is whole
    listed, on_disk = _listed_and_on_disk(ds)
    assert listed <= on_disk
    if point.startswith("shard_write"):  # killed between the shard's write and its rename
        assert any(name.startswith("shard-") for name in temps(ds))
    if point.startswith("manifest_write"):  # a shard renamed into place, not yet listed: adopted on resume
        assert any(name.startswith("manifest.json") for name in temps(ds)) and on_disk - listed

    resumed = Path(extract(compose("extract", ARGS + [f"paths.datasets_dir={tmp_path}"])))
    assert resumed == ds and not temps(ds)
    assert_same_dataset(ds, reference)


def test_full_disk_during_extraction_stops_cleanly_and_resumes(reference, tmp_path, monkeypatch):
    monkeypatch.setenv(faults.ENV, "shard_write@3:enospc")  # the third shard's write finds the disk full
    faults.reset()
    with pytest.raises(DiskSpaceError) as e:
        extract(compose("extract", ARGS + [f"paths.datasets_dir={tmp_path}"]))
    monkeypatch.delenv(faults.ENV)
    (ds,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    msg = str(e.value)
    assert f"{ds}/shard-" in msg and "disk full" in msg  # the file it was writing
    assert "needs" in msg and " bytes)" in msg and "samples are still to be written" in msg
    assert "re-run the same command to resume" in msg
    m = Manifest.read(ds)
    assert not temps(ds) and not m.complete  # nothing half-written left, nothing claimed whole
    listed, on_disk = _listed_and_on_disk(ds)
    assert damaged_shards(ds, m, "full") == [] and listed == on_disk and m.num_samples > 0

    extract(compose("extract", ARGS + [f"paths.datasets_dir={tmp_path}"]))  # space freed: the same command
    assert_same_dataset(ds, reference)


def test_a_full_disk_is_reported_once_with_its_advice(tmp_path, monkeypatch):
    """The error the user sees (the traceback with its causes) says disk full once, with the advice:
    it used to chain three copies (the writer thread's, its re-raise, the extraction's), the advice
    only in the last."""
    monkeypatch.setenv(faults.ENV, "shard_write@3:enospc")
    faults.reset()
    with pytest.raises(DiskSpaceError) as e:
        extract(compose("extract", ARGS + [f"paths.datasets_dir={tmp_path}"]))
    printed = "".join(traceback.format_exception(e.value))
    assert printed.count("disk full (") == 1, printed
    assert "re-run the same command to resume" in printed


def test_regeneration_killed_resumes_to_the_same_dataset(tmp_path):
    """data.regenerate: the target's answers are cached batch by batch; killed after the
    second batch, the rerun generates only the rest and gives the uninterrupted dataset."""
    regen = [
        "data.regenerate=true",
        "data.regen_backend=hf",
        "data.regen_max_tokens=4",
        "data.regen_max_turns=1",
        "data.regen_batch_size=4",
        "data.max_samples=10",
    ]

    def args(name: str) -> list[str]:
        cache = tmp_path / name / "cache"  # each run its own answer cache, the same target weights
        if not cache.exists():
            cache.mkdir(parents=True)
            (cache / "targets").symlink_to(CACHE / "targets")
        return ARGS + regen + [f"paths.cache_dir={cache}", f"paths.datasets_dir={tmp_path / name / 'data'}"]

    straight = Path(extract(compose("extract", args("straight"))))
    killed = cli(["extract.py", *args("killed")], fault="regen@2")
    assert_killed(killed)
    (answers,) = (tmp_path / "killed" / "cache" / "regenerated").glob("*.jsonl")
    assert len(answers.read_text().splitlines()) == 8  # two batches of 4 durable
    resumed = Path(extract(compose("extract", args("killed"))))
    (want,) = (tmp_path / "straight" / "cache" / "regenerated").glob("*.jsonl")
    got = [json.loads(line) for line in answers.read_text().splitlines()]
    assert len({r["id"] for r in got}) == len(got)  # the rest generated once, nothing twice
    assert sorted(got, key=lambda r: r["id"]) == sorted(
        (json.loads(line) for line in want.read_text().splitlines()), key=lambda r: r["id"]
    )
    assert_same_dataset(resumed, straight)


@pytest.fixture(scope="module")
def straight_run(reference, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("straight-run")
    train(compose("train", ARGS + [f"paths.datasets_dir={reference.parent}"], output_dir=str(out)))
    return out


def _train_cli(reference: Path, run_dir: Path, fault: str):
    return cli(["train.py", *ARGS, f"paths.datasets_dir={reference.parent}", f"hydra.run.dir={run_dir}"], fault=fault)


def _assert_same_run(got: Path, want: Path) -> None:
    a = torch.load(want / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    b = torch.load(got / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert a["global_step"] == b["global_step"] == 6
    for k, v in a["state_dict"].items():
        torch.testing.assert_close(b["state_dict"][k], v, rtol=1e-5, atol=1e-6, msg=k)
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (want, got))
    val = sorted(k for k in sa["final"] if k.startswith("val/"))  # train/* hold timings too
    assert val and val == sorted(k for k in sb["final"] if k.startswith("val/"))
    for k in val:
        assert sb["final"][k] == pytest.approx(sa["final"][k], rel=1e-4, abs=1e-5), k
    ea, eb = (load_file(str(Path(s["export_dir"]) / "model.safetensors")) for s in (sa, sb))
    assert ea.keys() == eb.keys()
    for k in ea:  # bf16 weights of fp32 states equal to 1e-5: at most one bf16 step apart
        torch.testing.assert_close(eb[k].float(), ea[k].float(), rtol=1e-2, atol=1e-3, msg=k)
    assert (Path(sb["export_dir"]) / "config.json").read_text() == (Path(sa["export_dir"]) / "config.json").read_text()


def test_training_killed_while_saving_a_checkpoint_resumes_from_the_last_whole_one(reference, straight_run, tmp_path):
    run_dir = tmp_path / "run"
    # saves at step 3: best, last; at step 6 the third save (best or last) is killed mid-way
    assert_killed(_train_cli(reference, run_dir, "checkpoint_write@3"))
    ckpts = run_dir / "checkpoints"
    assert any(".ckpt.tmp-" in name for name in temps(ckpts))  # the killed save's temp, never renamed
    last = torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=False)  # the previous one, whole
    assert last["global_step"] == 3
    train(compose("train", ARGS + [f"paths.datasets_dir={reference.parent}"], output_dir=str(run_dir)))
    assert not temps(run_dir)
    _assert_same_run(run_dir, straight_run)


def test_full_disk_while_saving_a_checkpoint_names_it_and_the_rerun_resumes(
    reference, straight_run, tmp_path, monkeypatch, caplog
):
    """The disk fills while the step-6 checkpoint is written: the error names the file, what the
    checkpoint needs and what is free, and the whole checkpoints still there; nothing half-written
    is left, last.ckpt is the step-3 one, and the same command resumes to the uninterrupted run."""
    run_dir = tmp_path / "run"
    monkeypatch.setenv(faults.ENV, "checkpoint_write@3:enospc")
    faults.reset()
    with pytest.raises(DiskSpaceError) as e, caplog.at_level("INFO", logger="eagle3.util.report"):
        train(compose("train", ARGS + [f"paths.datasets_dir={reference.parent}"], output_dir=str(run_dir)))
    monkeypatch.delenv(faults.ENV)
    ckpts = run_dir / "checkpoints"
    estimated = [r.getMessage() for r in caplog.records if r.getMessage().startswith("checkpoints: ")]
    size = format_bytes((ckpts / "last.ckpt").stat().st_size)
    assert len(estimated) == 1 and estimated[0].startswith(f"checkpoints: {size} each"), (estimated, size)
    assert "up to 3 at once" in estimated[0] and " free there" in estimated[0]
    msg = str(e.value)
    assert f"{ckpts}/" in msg and "disk full writing this checkpoint" in msg and " free " in msg
    need = int(msg.split(" bytes)")[0].rsplit("(", 1)[1])
    assert abs(need - (ckpts / "last.ckpt").stat().st_size) < 0.02 * need  # what one checkpoint holds
    assert "Whole checkpoints kept: best-step3.ckpt, last.ckpt" in msg and "resumes" in msg
    assert not temps(run_dir)
    assert torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 3
    train(compose("train", ARGS + [f"paths.datasets_dir={reference.parent}"], output_dir=str(run_dir)))
    _assert_same_run(run_dir, straight_run)


def test_the_checkpoint_size_train_estimates_is_what_it_writes(straight_run):
    """train.py checks its checkpoints' disk before the first step from the module's own figure
    (weights kept + AdamW's two moments); the files it then wrote are that size."""
    estimated = json.loads((straight_run / "summary.json").read_text())["checkpoint_bytes"]
    for ckpt in (straight_run / "checkpoints").glob("*.ckpt"):
        assert abs(ckpt.stat().st_size - estimated) < 0.02 * estimated, (ckpt.name, ckpt.stat().st_size, estimated)


def test_export_killed_leaves_the_previous_one_and_the_rerun_exports(reference, straight_run, tmp_path):
    run_dir = tmp_path / "run"
    assert_killed(_train_cli(reference, run_dir, "export_write"))  # trained, killed while exporting
    left = temps(run_dir)
    assert not (run_dir / "export").exists() and left and all(n.startswith("export.tmp-") for n in left)
    train(compose("train", ARGS + [f"paths.datasets_dir={reference.parent}"], output_dir=str(run_dir)))
    _assert_same_run(run_dir, straight_run)  # resumed at its last step: nothing retrained, same metrics
    assert not temps(run_dir)

    before = file_bytes(run_dir / "export")
    again = cli(
        [
            "export.py",
            f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}",
            f"out={run_dir / 'export'}",
            "num_draft_tokens=5",
        ],
        fault="export_write",
    )
    assert_killed(again)
    assert file_bytes(run_dir / "export") == before  # the previous export, whole and unchanged
    write_export(*checkpoint_head(run_dir / "checkpoints" / "last.ckpt", 5), run_dir / "export")  # unkilled: swapped in
    config = json.loads((run_dir / "export" / "config.json").read_text())
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
    assert load_file(str(run_dir / "export" / "model.safetensors")).keys() == load(before["model.safetensors"]).keys()
    assert not temps(run_dir)


def test_merge_killed_is_redone_to_the_same_dataset(tmp_path):
    parts_root = tmp_path / "parts"
    for i in range(2):
        extract(compose("extract", ARGS + [f"paths.datasets_dir={parts_root}", f"shard_index={i}", "num_shards=2"]))
    (final_name,) = {p.name.split(".part-")[0] for p in parts_root.iterdir()}
    roots = {}
    for name in ("straight", "killed"):
        roots[name] = tmp_path / name
        for i in range(2):
            shutil.copytree(part_dir(parts_root / final_name, i, 2), part_dir(roots[name] / final_name, i, 2))
    merge_parts(roots["straight"] / final_name, 2, draft_vocab_sizes=[2048])

    merge_args = ARGS + ["num_shards=2", "merge=true"]
    assert_killed(cli(["extract.py", *merge_args, f"paths.datasets_dir={roots['killed']}"], fault="merge"))
    final = roots["killed"] / final_name
    assert not final.exists() and all(part_dir(final, i, 2).is_dir() for i in range(2))  # nothing half-merged
    extract(compose("extract", merge_args + [f"paths.datasets_dir={roots['killed']}"]))
    assert file_bytes(final) == file_bytes(roots["straight"] / final_name)
    assert not any(part_dir(final, i, 2).exists() for i in range(2)) and not temps(roots["killed"])
