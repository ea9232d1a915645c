"""The export directory's owner: what an export holds, who writes each file, and the two steps
train.py and ``python export.py`` both take: ``write_export`` (the head, over any previous
export) and ``publish_export`` (its training record, serving advice, card and upload).

    file                  written by                                              on the Hub
    config.json           write_export (save_head, eagle3/draft/serving_format.py) yes; its verifier the
                                                                                   target's Hub id, else name
    model.safetensors     write_export (save_head)                                 yes
    eagle3_meta.json      write_export (save_head: draft config, aux ids, how the  yes, local paths
                          target ran); publish_export adds "training", the record  stripped
                          of the run (eagle3/serving/training_record.py)
    README.md             publish_export (the card, eagle3/serving/model_card.py);  rendered for the Hub
                          python evaluate.py rewrites it after each measurement    (no local path)
    serving.json          publish_export (the advice predicted from acceptance,    yes, local paths
                          eagle3/serving/advice.py); python evaluate.py            stripped
                          serving.measure=true (the measured one)
    serving_speedup.json  python evaluate.py serving.measure=true                  yes, paths stripped
    acceptance.json       the evaluation: train.py's, python evaluate.py           yes, paths stripped
                          (eagle3/evaluation/report.py)
    acceptance.png        the evaluation (eagle3/evaluation/plot.py)               yes
    acceptance-logs/      the evaluation's vLLM engine logs                        no
    wandb/                python evaluate.py's W&B run (logger.backend=wandb,      no
                          out_dir null); its printed `wandb sync` names it
    serving_work/         bench/serving_speedup.py's engines beside its --out file no (an export
                                                                                   holding it is refused)

"On the Hub": what a push (eagle3/serving/hub_push.py) uploads, decided by
eagle3/serving/hub_upload.py, which also deletes the previous head's files the new export lacks.
The names are eagle3/draft/export_files.py's constants (every layer that reads one imports
them there). Anything else in the directory makes it no export: write_export refuses it,
touching nothing (serving_format.check_export_dir).

Over a previous export, write_export swaps the directory whole (a killed export leaves the
previous one) and carries over what it did not write itself: for the same weights (the same
model.safetensors bytes) every file is kept in place, the training record too; for other weights
the previous head's measurements (acceptance.json/.png, serving.json, serving_speedup.json,
acceptance-logs/) move to ``<out>.previous-<UTC time>/`` beside it (said in its lines), and
wandb/ stays in place (a W&B run is never deleted: its printed `wandb sync` keeps working).
``out`` a symlink: the export is written into its target (the link kept); a dangling one is
refused naming both. A full disk is a DiskSpaceError naming the directory, the bytes needed and
the free space, the previous export whole.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from eagle3.draft.export_files import (
    ACCEPTANCE,
    ADVICE,
    CARD,
    CONFIG,
    ENGINE_LOGS,
    EXPORT_FILES,
    FORMAT_FILES,
    LOCAL_ONLY,
    MEASUREMENTS,
    META,
    SPEEDUP,
    WANDB,
    WEIGHTS,
)
from eagle3.draft.head import Eagle3DraftHead
from eagle3.draft.serving_format import DraftMeta, ExportDirError, export_state_dict, save_head
from eagle3.serving.advice import head_sha256
from eagle3.serving.training_record import RECORD_KEY, read_record, write_training_record
from eagle3.store.disk import DiskSpaceError, disk_full, format_bytes, free_bytes
from eagle3.util.atomic import TMP_MARK

__all__ = [
    "ACCEPTANCE",
    "ADVICE",
    "CARD",
    "CONFIG",
    "ENGINE_LOGS",
    "EXPORT_FILES",
    "LOCAL_ONLY",
    "META",
    "SPEEDUP",
    "WANDB",
    "WEIGHTS",
    "Published",
    "Written",
    "export_path",
    "publish_export",
    "run_dir_of",
    "write_export",
]

KEPT_IN_PLACE = (WANDB,)  # kept whatever the weights: a W&B run is never deleted nor moved


@dataclass
class Written:
    directory: Path  # where the export is (a symlink's target where ``out`` was one)
    lines: list[str] = field(default_factory=list)  # what was carried over or moved aside, to print


def export_path(out: str | Path) -> Path:
    """Where an export to ``out`` goes: ``out``, or the directory a symlink ``out`` points to (the
    export is written there, atomically, and the link kept); a dangling link is refused."""
    out = Path(out)
    if not out.is_symlink():
        return out
    target = out.resolve()
    if not target.is_dir():
        what = "a file" if target.exists() else "nothing"
        raise ExportDirError(
            f"out={out} is a symlink to {target}, which is {what}: expected a link to a directory (a previous "
            "export or an empty one); nothing was written: pass out=<a directory>"
        )
    return target


def write_export(head: Eagle3DraftHead, meta: DraftMeta, out: str | Path) -> Written:
    """The head as an export at ``out`` (save_head), over a previous export keeping what it did not
    write (the module's docstring); a full disk named as such, nothing left behind."""
    directory = export_path(out)
    written = Written(
        directory, [f"out={out} is a symlink: exported into {directory}"] if directory != Path(out) else []
    )
    try:
        save_head(head, meta, directory, before_swap=lambda tmp: written.lines.extend(_carry_over(directory, tmp)))
    except Exception as e:
        if not disk_full(e):
            raise
        need = sum(t.numel() * t.element_size() for t in export_state_dict(head).values())
        raise DiskSpaceError(
            f"{directory}: disk full writing the export: needs {format_bytes(need)} ({need} bytes) for {WEIGHTS} "
            f"and a few KiB beside it, {format_bytes(free_bytes(directory.parent))} free there "
            f"({type(e).__name__}: {e}); nothing was written"
            + (", the previous export is whole" if (directory / WEIGHTS).is_file() else "")
            + ". Free disk (or pass out=<a directory on a larger disk>) and rerun the same command."
        ) from e
    return written


def _carry_over(out: Path, tmp: Path) -> list[str]:
    """Into the new export ``tmp`` (before it replaces ``out``): what the previous export at ``out``
    holds that the export does not write (hard links: the swap then deletes nothing of it). The same
    weights keep everything and their training record; other weights keep wandb/ and move the
    previous head's measurements aside. Returns the lines that say so."""
    if not out.is_dir():
        return []
    theirs = [p for p in sorted(out.iterdir()) if p.name not in (*FORMAT_FILES, CARD) and TMP_MARK not in p.name]
    same = head_sha256(out) == head_sha256(tmp)
    if same:
        record = read_record(out)
        if record:
            meta = json.loads((tmp / META).read_text())
            (tmp / META).write_text(json.dumps({**meta, RECORD_KEY: record}, indent=2))
    aside = [p for p in theirs if not same and p.name in MEASUREMENTS]
    for p in theirs:
        if p not in aside:
            _link_tree(p, tmp / p.name)
    if not aside:
        return []
    moved = _aside_dir(out)
    for p in aside:
        _link_tree(p, moved / p.name)
    return [
        f"the previous export's measurements ({', '.join(p.name for p in aside)}) are of other weights: "
        f"moved to {moved}"
    ]


def _aside_dir(out: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for n in range(1000):
        moved = out.with_name(f"{out.name}.previous-{stamp}" + (f"-{n}" if n else ""))
        try:
            moved.mkdir()
            return moved
        except FileExistsError:
            continue
    raise FileExistsError(f"{out.parent}: no free name for {out.name}.previous-{stamp}-<n>")


def _link_tree(src: Path, dst: Path) -> None:
    """``src`` (a file, a symlink or a folder) as ``dst``: files hard-linked (copied where the
    filesystem cannot link), symlinks recreated as they are."""
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        dst.mkdir()
        for child in sorted(src.iterdir()):
            _link_tree(child, dst / child.name)
    else:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


# ------------------------------------------------------------ the publish step


def run_dir_of(ckpt: str | Path) -> Optional[Path]:
    """train.py's run dir of a checkpoint in its checkpoints/ (summary.json beside them), else None."""
    path = Path(ckpt)
    run_dir = path.parent.parent
    return run_dir if path.parent.name == "checkpoints" and (run_dir / "summary.json").is_file() else None


@dataclass
class Published:
    lines: list[str]  # the `vllm serve` command, the advice, the upload: to print
    push_failed: Optional[str] = None  # why the upload failed (the export is whole), else None


def publish_export(
    export_dir: str | Path,
    *,
    run_dir: str | Path | None = None,
    ckpt: str | Path | None = None,
    acceptance_file: str | Path | None = None,
    target_dir: str | Path | None = None,
    push_to_hub: Optional[str] = None,
    hub_private: bool = True,
    hub_key: str = "push_to_hub",
    retry: str = "",
) -> Published:
    """After write_export (and train.py's evaluation): the training record of ``run_dir``'s training
    of ``ckpt`` (none where the run dir holds no summary.json: a record carried over stays), the
    serving advice and the `vllm serve` lines (serve_command.export_serving_lines, ``acceptance_file``
    default the export's, ``target_dir`` the target's local copy for the advice), the card, then
    the upload to ``push_to_hub`` (checked again first; a failure is returned, naming ``retry``)."""
    from eagle3.serving.hub_push import publish_lines
    from eagle3.serving.model_card import write_card
    from eagle3.serving.serve_command import export_serving_lines

    export_dir = Path(export_dir)
    if run_dir is not None:
        write_training_record(export_dir, run_dir, ckpt)
    lines = export_serving_lines(export_dir, acceptance_file, target_dir=target_dir)  # writes serving.json
    write_card(export_dir, target_dir=target_dir)  # after the advice: the card shows the same
    pushed, failed = publish_lines(export_dir, push_to_hub, hub_private, hub_key, retry)
    return Published(lines + pushed, failed)
