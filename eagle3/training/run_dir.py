"""Guards of train.py around one run: one training per run directory, leftovers of a killed
one cleared, a rerun under another config refused, and a damaged dataset answered with the
command that repairs it."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from eagle3.config.schema import RunConfig, plain
from eagle3.training.checkpoint_io import newest_whole_checkpoint
from eagle3.util.atomic import remove_stale_temps, write_text
from eagle3.util.locks import DirLock

LOCK = ".train.lock"
RUN_CONFIG = "run_config.json"  # the config the run dir's checkpoints were trained under
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


# Keys of the run config that do not change the trained head (nor which checkpoint is
# exported): a rerun may change them and still resume. Every other key counts, new ones too.
# A name ending in "." is a whole group.
NOT_THE_RESULT = (
    "task_name",
    "tags",
    "logger.",  # where the metrics go
    "paths.",  # where things live: the dataset is found by its fingerprint, not its place
    "ckpt_path",  # how to resume, not what
    "resume_anyway",
    "export.push_to_hub",  # where the head is published, not what it is
    "export.hub_private",
    "dataset_other_weights",  # a permission: the dataset itself counts (dataset_dir, data.*, model.*)
    "sizes",  # the preset's name: its values are compared under train.*, data.*, eval.*
    "sizes_source",
    # extract.py only
    "shard_index",
    "num_shards",
    "merge",
    "topology.extract_tp",
    "topology.extract_dp",
    # how extraction runs, not what it stores (the dataset fingerprint leaves them out too;
    # capture.dtype, which it keeps, counts)
    "capture.backend",
    "capture.batch_size",
    "capture.max_tokens_per_batch",
    "capture.shard_max_tokens",
    "capture.writer_threads",
    "capture.vllm_route",
    "capture.enable_prefix_caching",
    "capture.gpu_memory_utilization",
    "capture.cpu_kvcache_space_gb",
    "capture.max_num_seqs",
    "capture.disk_margin",
    "capture.verify",
    "capture.disk_per_1m_tokens",
    "data.regen_backend",
    "data.max_bad_fraction",  # a file that passes gives the same samples (the fingerprint leaves it out too)
    "data.regen_batch_size",
    "data.regen_static_cache",
    # the acceptance evaluation after training, on the exported head (eval.num_draft_tokens and
    # eval.max_new_tokens count: the validation replay's K and answer cut pick the exported
    # checkpoint, and K is in its config.json)
    "eval.enabled",
    "eval.max_prompts",
    "eval.suite_prompts",
    "eval.math_prompts",
    "eval.humaneval_prompts",
    "eval.diagnostics",
    "engine.",  # how the acceptance evaluation's vLLM engines are built
    "eval.enforce_eager",  # engine.enforce_eager's former key: a run dir's recorded config may hold it
    # what is shown or kept, not what is trained
    "trainer.enable_progress_bar",
    "trainer.profiler",
    "callbacks.lr_monitor",
    "callbacks.model_checkpoint.save_last",
    "callbacks.model_checkpoint.save_top_k",
    "callbacks.model_checkpoint.disk",
    "callbacks.model_checkpoint.check_disk",
    # how the data is fed and checked, not what is trained on (the batches are the sampler's,
    # whatever the number of loader processes)
    "train.num_workers",
    "trainer.num_sanity_val_steps",
    "trainer.detect_anomaly",
    # the run's length: a rerun may extend a run (or stop it sooner) from where it is. The cosine's
    # length counts as SCHEDULE_STEPS only where train.lr_decay_steps sets it on both sides; null
    # means "follow the run's length", so a longer max_steps stretches the rest of the cosine
    # (resume_note says so, and how to keep the schedule already followed)
    "train.max_steps",
    "train.max_time",
    "train.max_epochs",
    "train.lr_decay_steps",
)
SCHEDULE_STEPS = "train.lr_decay_steps"


class RunConfigChangedError(ValueError):
    """A rerun into a run dir whose checkpoints were trained under another config."""


def _flat(node: object, prefix: str = "") -> dict[str, object]:
    if isinstance(node, dict):
        out: dict[str, object] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def _counts(key: str) -> bool:
    return not any(key == n or (n.endswith(".") and key.startswith(n)) for n in NOT_THE_RESULT)


def _same_path(value: object) -> object:
    """A path-like string in one spelling: ``dir/./c.jsonl``, ``dir//c.jsonl``, ``~/c.jsonl`` and a
    symlink name the file they point at (an existing one by its real path). Hub ids and other
    strings come back as they are (normpath leaves ``org/name`` alone)."""
    if not isinstance(value, str) or not ("/" in value or value.startswith("~")) or "://" in value:
        return value
    path = os.path.expanduser(value)
    return os.path.realpath(path) if os.path.exists(path) else os.path.normpath(path)


def result_keys(cfg: RunConfig | Mapping[str, object]) -> dict[str, object]:
    """The config's values that change the trained head, by dotted key (as JSON stores them;
    paths in one spelling)."""
    data = plain(cfg) if isinstance(cfg, RunConfig) else dict(cfg)
    data = json.loads(json.dumps(data, default=str))
    flat = _flat(data)
    return {k: _same_path(v) for k, v in flat.items() if _counts(k)}


def config_changes(old: Mapping[str, object], new: Mapping[str, object]) -> list[tuple[str, object, object]]:
    """(key, old value, new value) for each key of what changes the result that differs; a key
    one side lacks is ``"<absent>"`` there, and no change where the other side holds it null (a key
    added since, unset: it does what the config without it did). The schedule's length counts where
    both set it."""
    a, b = result_keys(old), result_keys(new)
    absent = "<absent>"
    changes = [
        (k, a.get(k, absent), b.get(k, absent))
        for k in sorted(set(a) | set(b))
        if a.get(k, absent) != b.get(k, absent) and {a.get(k, absent), b.get(k, absent)} != {absent, None}
    ]
    was, now = _schedule(old), _schedule(new)
    if was[1] is not None and now[1] is not None and was[0] != now[0]:
        changes.append((SCHEDULE_STEPS, was[0], now[0]))
    return changes


def _schedule(cfg: Mapping[str, object]) -> tuple[object, object]:
    """(the cosine's length, train.lr_decay_steps as set) of a plain config."""
    train = cfg.get("train") if isinstance(cfg.get("train"), Mapping) else {}
    assert isinstance(train, Mapping)
    decay = train.get("lr_decay_steps")
    return (decay if decay else train.get("max_steps")), decay


def resume_note(old: Mapping[str, object], new: Mapping[str, object]) -> str | None:
    """What a resume under a longer or shorter run does to the cosine whose length follows
    max_steps (lr_decay_steps null), and how to keep the one already followed; else None."""
    (was, _), (now, decay) = _schedule(old), _schedule(new)
    if decay is not None or was == now or was is None:
        return None
    return (
        f"resuming with train.max_steps={now} (was {was}): the rest of the cosine now spans {now} steps; "
        f"add train.lr_decay_steps={was} to keep the schedule already followed"
    )


def check_run_config(output_dir: Path, cfg: RunConfig) -> None:
    """Refuse to resume the run dir's checkpoints under another config than theirs.

    ``<run dir>/run_config.json`` records the config the run dir's training started under (Hydra's
    ``.hydra/config.yaml`` cannot: a rerun overwrites it before train.py starts). A rerun that
    would resume from a checkpoint here (ckpt_path null, auto or last, and a whole checkpoint in
    checkpoints/) with a config that differs in a key that changes the result
    (``NOT_THE_RESULT`` lists those that do not) raises RunConfigChangedError naming each key
    with its old and new value: resuming would restore the old run's weights, optimizer and
    schedule and ignore the new values (a finished run would re-export its old head as the new
    config's). ``resume_anyway=true`` resumes it all the same, and the record then holds the new
    config. Otherwise (nothing to resume, the same config) the record is (re)written; a run dir
    whose checkpoints predate the record is resumed as before, and recorded."""
    output_dir = Path(output_dir)
    record = output_dir / RUN_CONFIG
    ckpt = resume_point(output_dir, cfg)
    new = plain(cfg)
    if ckpt is not None and record.is_file():
        try:
            old = json.loads(record.read_text())["config"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise RunConfigChangedError(
                f"{record}: unreadable ({type(e).__name__}: {e}); it records the config this run dir's "
                f"checkpoints were trained under: add resume_anyway=true to resume {ckpt} with this "
                "config, or train into another run dir (hydra.run.dir=...)"
            ) from None
        changes = config_changes(old, new)
        if changes and not cfg.resume_anyway:
            listed = "; ".join(f"{k}: {o!r} -> {n!r}" for k, o, n in changes)
            raise RunConfigChangedError(
                f"{record}: the run dir {output_dir} was trained under another config: {listed} (recorded -> "
                f"now). Resuming it ({ckpt}) would restore the old run's weights, optimizer and schedule "
                "and ignore the new values. Train into another run dir (hydra.run.dir=<new dir>) for this "
                "config, or add resume_anyway=true to resume this run all the same"
            )
        if changes:
            print(f"resume_anyway=true: resuming {ckpt} under a changed config: {len(changes)} keys differ")
        if (note := resume_note(old, new)) is not None:
            print(note)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_text(record, json.dumps({"config": new}, indent=1, default=str))


def resume_point(output_dir: Path, cfg: RunConfig) -> Path | None:
    """The checkpoint this run would resume (ckpt_path null, auto or last, and a whole checkpoint
    in the run dir's checkpoints/); None: it starts afresh (or from a ckpt_path of its own)."""
    if cfg.ckpt_path not in (None, "", "auto", "last") or not (Path(output_dir) / "checkpoints").is_dir():
        return None
    return newest_whole_checkpoint(Path(output_dir) / "checkpoints")


def check_dataset(output_dir: Path, cfg: RunConfig, dataset_dir: Path) -> None:
    """Refuse to resume the run dir's checkpoints on another dataset than the one they were trained
    on: ``<run dir>/dataset_manifest.json`` (written as training starts) holds its fingerprint; a
    changed chat file (or data settings) makes extract.py write a dataset of another fingerprint,
    and resuming a finished run would train 0 steps and export the old head as the new data's.
    ``resume_anyway=true`` resumes all the same. A run dir without the record is not checked (one
    written before the record was); a record that cannot be read is refused, naming it."""
    output_dir, dataset_dir = Path(output_dir), Path(dataset_dir)
    record = output_dir / "dataset_manifest.json"
    ckpt = resume_point(output_dir, cfg)
    if ckpt is None or not record.is_file() or cfg.resume_anyway:
        return
    try:
        old = str(json.loads(record.read_text())["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        # the one record of which dataset the checkpoints were trained on: unread, nothing is checked
        raise RunConfigChangedError(
            f"{record}: cannot be read ({type(e).__name__}: {e}): it says which dataset the run dir "
            f"{output_dir}'s checkpoints were trained on, and resuming {ckpt} without it could train them on "
            "another. Restore it, train into a new run dir (hydra.run.dir=<new dir>), or add resume_anyway=true "
            "to resume on this config's dataset all the same"
        ) from None
    new = str(json.loads((dataset_dir / "manifest.json").read_text())["fingerprint"])
    if old == new:
        return
    summary = output_dir / "summary.json"
    where = ""
    if summary.is_file():
        try:
            where = f" ({json.loads(summary.read_text()).get('dataset_dir')})"
        except ValueError:
            pass
    raise RunConfigChangedError(
        f"{record}: fingerprint: expected {old} (the dataset{where} the run dir {output_dir}'s checkpoints were "
        f"trained on), got {new} ({dataset_dir}, the dataset this config names now: the chat data or its settings "
        f"changed). Resuming {ckpt} would keep training (or, finished, re-export) the old head as this data's. "
        "Train into a new run dir (hydra.run.dir=<new dir>) for this dataset, or add resume_anyway=true to "
        "resume this run on it all the same"
    )


def _task_overrides() -> list[str] | None:
    """The command-line overrides of this Hydra run; None outside one (a notebook, a test)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except (ImportError, ValueError):
        return None


def repair_command(dataset_dir: str | None, directory: Path, expected_name: str, needs_hash: bool) -> str:
    """The extract.py command that repairs ``directory``: this run's overrides, the dataset's
    parent as paths.datasets_dir when it was given as ``dataset_dir`` (the run's dataset_dir=),
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
        words = [w for w in words if not w.startswith("paths.datasets_dir=")]
        words.append(shlex.quote(f"paths.datasets_dir={directory.parent}"))
    if needs_hash and not any(w.startswith("capture.verify=") for w in words):
        words.append("capture.verify=full")
    return " ".join(["python extract.py", *words])
