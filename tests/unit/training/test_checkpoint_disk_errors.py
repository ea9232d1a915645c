"""The checkpoint disk, said right (issue 48): the pre-check, which sees the filesystem's free
space and no quota, has an override named in its refusal (callbacks.model_checkpoint.check_disk);
a save that fails for another reason is reported as itself, not as "disk full" because the free
space happens to be short of the checkpoint."""

from __future__ import annotations

import errno
import stat
from pathlib import Path

import pytest
import torch
from conftest import compose

from eagle3.config.schema import run_config
from eagle3.store.disk import DiskSpaceError, free_bytes
from eagle3.training.checkpoint_io import AtomicCheckpointIO, check_checkpoint_disk, disk_full


def test_the_pre_check_names_its_override_and_the_override_measures_only(tmp_path):
    ckpts = tmp_path / "run" / "checkpoints"
    each = free_bytes(tmp_path)  # three cannot fit
    with pytest.raises(DiskSpaceError, match=r"callbacks\.model_checkpoint\.check_disk=false skips this check"):
        check_checkpoint_disk(ckpts, each, 3)
    need, free = check_checkpoint_disk(ckpts, each, 3, enabled=False)
    assert need == 3 * each and free > 0
    cfg = run_config(compose("train", ["experiment=tiny_test", "callbacks.model_checkpoint.check_disk=false"]))
    assert cfg.callbacks.model_checkpoint.check_disk is False
    assert run_config(compose("train", ["experiment=tiny_test"])).callbacks.model_checkpoint.check_disk is True


class _NotADiskError:
    """Pickled into a checkpoint, it fails the save as a bug in a callback's state would."""

    def __reduce__(self):
        raise RuntimeError("a callback's state cannot be saved")


def test_a_save_failing_for_another_reason_is_reported_as_itself(tmp_path):
    path = tmp_path / "checkpoints" / "last.ckpt"
    # a checkpoint that counts for more bytes than the disk has free (a view of one element)
    huge = torch.zeros(1).expand(free_bytes(tmp_path) + 1)
    with pytest.raises(RuntimeError, match="a callback's state cannot be saved") as e:
        AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": huge}, "callback": _NotADiskError()}, path)
    assert not isinstance(e.value, DiskSpaceError)
    assert not path.exists() and not list(path.parent.iterdir())  # its temp removed


def test_what_counts_as_a_full_disk():
    assert disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert disk_full(RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"))
    assert disk_full(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"))
    assert not disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not disk_full(RuntimeError("CUDA error: an illegal memory access was encountered"))


def test_torch_saves_own_write_failure_is_its_message(tmp_path):
    """torch.save into a device that is always full: the message disk_full reads."""
    full = Path("/dev/full")
    if not (full.exists() and stat.S_ISCHR(full.stat().st_mode)):  # a sandbox without it: torch.save would make a file
        pytest.skip("/dev/full is not the always-full character device here")
    try:
        torch.save({"w": torch.zeros(100_000)}, "/dev/full")
    except RuntimeError as e:
        assert disk_full(e), str(e)
    else:
        pytest.fail("torch.save wrote into /dev/full")
