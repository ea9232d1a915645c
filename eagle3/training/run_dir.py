"""Guards of train.py around one run: one training per run directory, leftovers of a killed
one cleared, and a damaged dataset answered with the command that repairs it."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from eagle3.util.atomic import remove_stale_temps
from eagle3.util.locks import DirLock

LOCK = ".train.lock"
# train.py keys that extract.py does not take, or that point at the dataset another way
_NOT_FOR_EXTRACT = ("ckpt_path", "dataset_dir", "hparams_search")


def global_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank as torchrun or srun set it (0 when launched alone)."""
    env = os.environ if env is None else env
    for key in ("RANK", "SLURM_PROCID"):
        if str(env.get(key, "")).isdigit():
            return int(env[key])
    return 0


@contextmanager
def run_dir_lock(output_dir: Path) -> Iterator[None]:
    """Rank 0 holds ``<run dir>/.train.lock`` for the whole run: a second training into the
    same directory is refused with the holder's pid and host (``eagle3.util.locks``). Holding it,
    temps left in checkpoints/ by a killed save are removed."""
    if global_rank() != 0:
        yield
        return
    with DirLock(Path(output_dir) / LOCK, f"another training is writing the run dir {output_dir}"):
        remove_stale_temps(Path(output_dir) / "checkpoints")
        yield


def _task_overrides() -> list[str] | None:
    """The command-line overrides of this Hydra run; None outside one (a notebook, a test)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except (ImportError, ValueError):
        return None


def repair_command(dataset_dir: str | None, directory: Path, expected_name: str, needs_hash: bool) -> str:
    """The extract.py command that repairs ``directory``: this run's overrides, the dataset's
    parent as paths.data_dir when it was given as ``dataset_dir`` (the run's dataset_dir=),
    capture.verify=full when only a hash finds the damage. ``expected_name``: this config's
    dataset directory name."""
    overrides = _task_overrides()
    if overrides is None:
        words = ["<the overrides of this train.py run>"]
    else:
        words = [shlex.quote(o) for o in overrides if o.split("=", 1)[0].lstrip("+~") not in _NOT_FOR_EXTRACT]
    directory = Path(directory)
    if dataset_dir:
        if directory.name != expected_name:
            return (
                f"python extract.py <the overrides that made {directory.name}> (this config's dataset would be "
                f"{expected_name}: repair it where it was extracted)"
            )
        words = [w for w in words if not w.startswith("paths.data_dir=")]
        words.append(shlex.quote(f"paths.data_dir={directory.parent}"))
    if needs_hash and not any(w.startswith("capture.verify=") for w in words):
        words.append("capture.verify=full")
    return " ".join(["python extract.py", *words])
