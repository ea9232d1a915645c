"""Nothing silently wrong in what training reads and writes (issue 37): non-finite values refused
where they enter (shard read, loss, export), checkpoints loaded as data only, a rerun under
another config refused, summary.json and the export's metadata written whole or not at all."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch
from conftest import compose
from helpers import tear_writes, tiny_head_with_meta, write_random_dataset
from helpers.datasets import RANDOM_H, RANDOM_LAYER_IDS
from safetensors.torch import load_file

from eagle3.config.schema import run_config
from eagle3.draft.serving_format import NonFiniteWeightsError, save_head
from eagle3.serving.export_dir import write_export
from eagle3.store import HiddenStateDataset
from eagle3.store.batch_options import BatchShape
from eagle3.store.disk import DiskSpaceError, free_bytes
from eagle3.store.reader import DamagedDatasetError
from eagle3.training import run_dir
from eagle3.training.checkpoint_io import (
    AtomicCheckpointIO,
    UnsafeCheckpointError,
    check_checkpoint_disk,
    checkpoint_head,
    checkpoints_at_once,
)

TINY = ["experiment=tiny_test"]


# ---- shard read: a NaN stored in a shard is refused as the sample is read, naming shard and sample


def _poke_hidden(shard: Path, element: int, value: bytes) -> None:
    """Overwrite one bf16 element of ``hidden`` in place (same size, valid header: what a flipped
    bit or a capture without the finite check leaves)."""
    raw = shard.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    start = 8 + n + header["hidden"]["data_offsets"][0] + 2 * element
    with open(shard, "r+b") as f:
        f.seek(start)
        f.write(value)


def test_a_non_finite_stored_hidden_state_is_refused_naming_shard_and_sample(tmp_path):
    write_random_dataset(tmp_path)
    ds = HiddenStateDataset(tmp_path)
    shard_k = int(ds._shard_of[3])
    shard = tmp_path / ds.manifest.shards[shard_k].file
    # sample 3's token 1, layer 2 (id 4), channel 5: its place in the shard's concatenated rows
    token = int(ds._start[3]) + 1
    _poke_hidden(shard, (token * len(RANDOM_LAYER_IDS) + 2) * RANDOM_H + 5, b"\xc0\x7f")  # bf16 NaN
    ds = HiddenStateDataset(tmp_path)  # the cheap open check (sizes) still passes
    for i in range(len(ds)):
        if i != 3:
            assert torch.isfinite(ds[i]["hidden"]).all()
    with pytest.raises(DamagedDatasetError) as e:
        ds[3]
    msg = str(e.value)
    assert str(shard) in msg and "sample 's3'" in msg and "hidden: expected finite values, got 1 non-finite" in msg
    assert "at token 1, layer id 4, channel 5" in msg and "nan" in msg
    _poke_hidden(shard, (token * len(RANDOM_LAYER_IDS) + 2) * RANDOM_H + 5, b"\x80\x7f")  # bf16 +Inf
    with pytest.raises(DamagedDatasetError, match=r"got 1 non-finite .*\(the first, inf,"):
        HiddenStateDataset(tmp_path)[3]
    _poke_hidden(shard, (token * len(RANDOM_LAYER_IDS) + 2) * RANDOM_H + 5, b"\x80\xff")  # bf16 -Inf
    with pytest.raises(DamagedDatasetError, match=r"got 1 non-finite .*\(the first, -inf,"):
        HiddenStateDataset(tmp_path)[3]
    # the check reads the sample's extremes first: the largest finite bf16 is no false alarm
    _poke_hidden(shard, (token * len(RANDOM_LAYER_IDS) + 2) * RANDOM_H + 5, b"\x7f\x7f")  # bf16 max, ~3.39e38
    assert float(HiddenStateDataset(tmp_path)[3]["hidden"][1, 2, 5]) > 3e38


# ---- export: non-finite weights are refused naming the tensor, the previous export left whole


def test_export_of_non_finite_weights_is_refused_and_the_previous_one_kept(tmp_path):
    head, meta = tiny_head_with_meta()
    out = save_head(head, meta, tmp_path / "export")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with torch.no_grad():
        head.layers[0].mlp.down_proj.weight[3, 4] = float("nan")
    with pytest.raises(NonFiniteWeightsError) as e:
        save_head(head, meta, out)
    msg = str(e.value)
    assert "model.safetensors: layers.0.mlp.down_proj.weight: expected finite weights, got 1 non-finite" in msg
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no temp left
    # fp32 weights beyond bf16's range become Inf when exported: refused too
    head, meta = tiny_head_with_meta()
    with torch.no_grad():
        head.fc.weight[0, 0] = 3.4e38  # fp32 max 3.403e38, bf16 max 3.390e38
    with pytest.raises(NonFiniteWeightsError, match=r"fc\.weight: expected finite weights, got 1 non-finite"):
        save_head(head, meta, tmp_path / "other")
    assert not (tmp_path / "other").exists()


# ---- checkpoints are data: a pickled object in one is refused and never runs


class _SideEffect:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (str(self.marker),))


def _checkpoint(path: Path, extra: dict | None = None) -> Path:
    head, meta = tiny_head_with_meta()
    state = {f"head.{k}": v for k, v in head.state_dict().items()}
    torch.save({"state_dict": state, "eagle3_meta": meta.to_dict(), **(extra or {})}, path)
    return path


def test_a_checkpoint_carrying_a_pickled_object_is_refused_and_its_code_never_runs(tmp_path):
    marker = tmp_path / "the-pickle-ran"
    evil = _checkpoint(tmp_path / "evil.ckpt", {"callbacks": {"x": _SideEffect(marker)}})
    with pytest.raises(UnsafeCheckpointError) as e:
        write_export(*checkpoint_head(evil), tmp_path / "export")
    assert str(evil) in str(e.value) and "expected a checkpoint of tensors and plain data" in str(e.value)
    assert "os.makedirs" in str(e.value)  # the global it refused
    with pytest.raises(Exception, match="os.makedirs"):  # a resume (Lightning's load) refuses it too
        AtomicCheckpointIO().load_checkpoint(evil, weights_only=False)
    assert not marker.exists() and not (tmp_path / "export").exists()
    # a checkpoint of tensors and plain data still exports
    out = write_export(*checkpoint_head(_checkpoint(tmp_path / "good.ckpt")), tmp_path / "export").directory
    assert set(load_file(str(out / "model.safetensors"))) >= {"fc.weight", "d2t", "t2d"}


# ---- summary.json and the export's metadata: a write that fails midway leaves the previous file


@pytest.fixture
def torn_writes(monkeypatch):
    tear_writes(monkeypatch)


def test_a_summary_write_that_fails_midway_leaves_the_previous_summary(tmp_path, torn_writes):
    from eagle3.stages.train import _write_summary

    previous = json.dumps({"final": {"val/replay_accept_len": 1.5}}, indent=2)
    with open(tmp_path / "summary.json", "w") as f:
        f.write(previous)
    with pytest.raises(OSError, match="No space left"):
        _write_summary(tmp_path, tmp_path / "export", {"final": {"val/replay_accept_len": 2.0}, "x": "y" * 100})
    assert (tmp_path / "summary.json").read_text() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_re_export_keeps_serving_and_acceptance_whole_when_their_write_fails(tmp_path, monkeypatch):
    from eagle3.serving import export_dir
    from eagle3.serving.advice import head_sha256
    from eagle3.stages import export as export_stage

    ckpt = _checkpoint(tmp_path / "a.ckpt")
    out = write_export(*checkpoint_head(ckpt), tmp_path / "export").directory
    serving = json.dumps({"source": "rule", "loads": [], "head_sha256": head_sha256(out)}, indent=2)
    acceptance = json.dumps({"acceptance_length": 2.0, "per_position": [0.6, 0.3]}, indent=2)
    (out / "serving.json").write_text(serving)
    (out / "acceptance.json").write_text(acceptance)
    monkeypatch.setattr("eagle3.serving.serve_command.export_serving_lines", lambda *_a, **_k: [])

    real_export = export_dir.write_export

    def export_then_tear(*args, **kwargs):  # the swap in happened; the metadata writes fail midway
        result = real_export(*args, **kwargs)

        def half(self, data, *a, **k):
            raw = data.encode() if isinstance(data, str) else data
            with open(self, "wb") as f:
                f.write(raw[: len(raw) // 2])
            raise OSError(28, "No space left on device", str(self))

        monkeypatch.setattr(Path, "write_text", half)
        monkeypatch.setattr(Path, "write_bytes", half)
        return result

    monkeypatch.setattr(export_dir, "write_export", export_then_tear)
    with pytest.raises(OSError, match="No space left"):
        export_stage.run(export_stage.ExportCliConfig(ckpt=str(ckpt), out=str(out)))
    monkeypatch.undo()
    # each file whole (the one not yet rewritten absent at worst), never a torn JSON
    for name, text in (("serving.json", serving), ("acceptance.json", acceptance)):
        if (out / name).exists():
            assert (out / name).read_text() == text
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


# ---- a rerun into a run dir under another config is refused, naming the keys


def _cfg(tmp_path: Path, extra: list[str] = ()):
    return run_config(
        compose("train", TINY + [f"paths.datasets_dir={tmp_path / 'data'}", *extra], str(tmp_path / "run"))
    )


def test_a_rerun_under_another_config_is_refused_naming_the_keys(tmp_path):
    run = tmp_path / "run"
    run_dir.check_run_config(run, _cfg(tmp_path))  # a fresh run dir: recorded
    assert json.loads((run / run_dir.RUN_CONFIG).read_text())["config"]["train"]["lr"] == 3e-4
    # nothing to resume yet: another config starts afresh (and is recorded)
    run_dir.check_run_config(run, _cfg(tmp_path, ["train.lr=1e-3"]))
    run_dir.check_run_config(run, _cfg(tmp_path))
    (run / "checkpoints").mkdir()
    torch.save({"global_step": 6}, run / "checkpoints" / "last.ckpt")
    run_dir.check_run_config(run, _cfg(tmp_path))  # the same config resumes
    # what does not change the head: still resumes
    run_dir.check_run_config(
        run,
        _cfg(tmp_path, ["eval.max_prompts=3", "logger.log_every_n_steps=1", "capture.batch_size=2", "tags=[x]"]),
    )
    # a longer run resumes (its length does not count); a schedule set to another length does not
    run_dir.check_run_config(run, _cfg(tmp_path, ["train.max_steps=12", "train.lr_decay_steps=6"]))
    with pytest.raises(run_dir.RunConfigChangedError, match=r"train\.lr_decay_steps: 6 -> 12"):
        run_dir.check_run_config(run, _cfg(tmp_path, ["train.max_steps=12", "train.lr_decay_steps=12"]))
    run_dir.check_run_config(run, _cfg(tmp_path, ["train.max_steps=12"]))
    run_dir.check_run_config(run, _cfg(tmp_path))
    with pytest.raises(run_dir.RunConfigChangedError) as e:
        run_dir.check_run_config(run, _cfg(tmp_path, ["train.lr=1e-3", "data.max_samples=20"]))
    msg = str(e.value)
    assert str(run / run_dir.RUN_CONFIG) in msg
    assert "train.lr: 0.0003 -> 0.001" in msg and "data.max_samples: 40 -> 20" in msg
    assert "eval.max_prompts" not in msg and "resume_anyway=true" in msg and "hydra.run.dir=" in msg
    with pytest.raises(run_dir.RunConfigChangedError, match=r"train\.lr: 0\.0003 -> 0\.001"):
        run_dir.check_run_config(run, _cfg(tmp_path, ["train.lr=1e-3", "ckpt_path=last"]))
    # asked for: resumed, and the new config is the record
    run_dir.check_run_config(run, _cfg(tmp_path, ["train.lr=1e-3", "resume_anyway=true"]))
    assert json.loads((run / run_dir.RUN_CONFIG).read_text())["config"]["train"]["lr"] == 1e-3
    run_dir.check_run_config(run, _cfg(tmp_path, ["train.lr=1e-3"]))


def test_which_keys_count(tmp_path):
    """Every key of the run config counts unless NOT_THE_RESULT names it (new keys count)."""
    keys = run_dir.result_keys(_cfg(tmp_path))
    for k in ("train.lr", "data.max_samples", "model.name", "layers.aux_ids", "seed"):
        assert k in keys
    for k in ("eval.num_draft_tokens", "eval.max_new_tokens", "topology.devices", "capture.dtype", "dataset_dir"):
        assert k in keys
    for k in ("paths.output_dir", "logger.backend", "eval.max_prompts", "ckpt_path", "resume_anyway", "tags"):
        assert k not in keys
    assert not [k for k in keys if k.startswith("engine.")]  # how the evaluation's engines are built
    assert run_dir.config_changes({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}) == [("a.c", "<absent>", 2)]
    # a recorded config that still holds engine.enforce_eager's former key resumes under the new one
    assert run_dir.config_changes({"eval": {"enforce_eager": True}}, {"engine": {"enforce_eager": True}}) == []


# ---- integration (heavy: run under flock /tmp/eagle3_heavy.lock): a diverging loss stops training


def test_batches_collated_in_loader_workers_equal_those_of_the_training_process(tmp_path):
    """A worker builds its batch in shared memory (it crosses to the training process without
    another copy): the batches are the same, value for value, as those collated in-process."""
    from eagle3.store.packing import pack_rows, packed_loader

    write_random_dataset(tmp_path, n=6)
    ds = HiddenStateDataset(tmp_path)
    batches = pack_rows(ds.lengths, 16, None)
    runs = [
        list(packed_loader(ds, list(range(len(ds))), batches, shape=BatchShape(16), num_workers=w, split=False))
        for w in (0, 2)
    ]
    assert len(runs[0]) == len(runs[1]) == len(batches) > 1
    for here, there in zip(*runs):
        assert set(here) == set(there)
        for key in here:
            assert torch.equal(here[key], there[key]), key


def test_checkpoints_that_outgrow_the_disk_are_refused_before_training(tmp_path):
    """A wide head's checkpoint is large (Kimi-K2.5's width: 13.7 GB) and a run holds up to three
    at once: the best, last.ckpt and the one being written. Three that cannot fit are refused up
    front, naming the size and what to change; checkpoints already there count as held."""
    assert checkpoints_at_once(1, True) == 3 and checkpoints_at_once(2, False) == 3
    ckpts = tmp_path / "run" / "checkpoints"  # not made yet: its disk is measured
    each = free_bytes(tmp_path) // 2  # one fits, three cannot
    with pytest.raises(DiskSpaceError) as e:
        check_checkpoint_disk(ckpts, each, 3)
    msg = str(e.value)
    assert msg.startswith(f"{ckpts}: not enough disk") and "up to 3 at once" in msg
    assert "callbacks.model_checkpoint.save_last=false" in msg and "hydra.run.dir" in msg
    assert check_checkpoint_disk(ckpts, each // 4, 3)[0] == 3 * (each // 4)  # three small ones fit
    # a resumed run: two whole checkpoints already there (sparse files: their size, not the disk)
    ckpts.mkdir(parents=True)
    for name in ("last.ckpt", "best-step3.ckpt"):
        with open(ckpts / name, "wb") as f:
            f.truncate(each)
    assert check_checkpoint_disk(ckpts, each, 3)[0] == each  # only the one being written is new
