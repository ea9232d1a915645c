"""train.py's stage: find the dataset of this config, train the head, export it, report."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Mapping

import lightning as L
from omegaconf import DictConfig

from eagle3.config.choices import HiddenStates
from eagle3.config.schema import ExportConfig, RunConfig, run_config
from eagle3.draft.replay import MEASURED_AGAINST_VLLM
from eagle3.extraction.identity import dataset_path
from eagle3.planning import machine_rates, time_budget, train_clock
from eagle3.planning.cost import train_lines
from eagle3.serving.export_dir import publish_export, write_export
from eagle3.serving.hub_push import HubPushError, preflight
from eagle3.serving.training_record import machine_record
from eagle3.stages.fit_report import report_fit
from eagle3.stages.narrow import dataset_identity
from eagle3.stages.selection import find_selection, picking_metric
from eagle3.stages.train_inputs import check_loss_fits_teacher, find_dataset, find_token_dataset
from eagle3.stages.train_parts import TrainParts, build_parts
from eagle3.stages.validate import validate_run_config
from eagle3.store import DamagedDatasetError, Manifest, format_bytes
from eagle3.target_model.resolve import resolve_target
from eagle3.training import run_dir
from eagle3.training.checkpoint_io import (
    check_checkpoint_disk,
    checkpoint_head,
    checkpoints_at_once,
    newest_whole_checkpoint,
)
from eagle3.training.final_checkpoint import keep_final_if_best
from eagle3.training.run_dir import global_rank, run_dir_lock
from eagle3.training.step_path import StepPath, resolve_step_path
from eagle3.util.atomic import write_text
from eagle3.util.clock import StageClock
from eagle3.util.launch import check_external_launch
from eagle3.util.report import report, say


def _resolve_ckpt(ckpt_path: str | None, ckpt_dir: Path) -> str | None:
    last = ckpt_dir / "last.ckpt"
    if ckpt_path in (None, "", "auto"):  # auto-resume in the same run dir, from its newest whole checkpoint
        found = newest_whole_checkpoint(ckpt_dir) if ckpt_dir.is_dir() else None
        return str(found) if found else None
    if ckpt_path == "last":
        if not last.is_file():
            raise FileNotFoundError(f"ckpt_path=last: no {last}; pass the run dir (hydra.run.dir=...) or a path")
        return str(last)
    if not Path(ckpt_path).is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path!r}: no such checkpoint file")
    return ckpt_path


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if "/" in k}


def run(cfg: DictConfig, extra_callbacks: Sequence[L.Callback] = ()) -> float:
    """``cfg``: the composed config (validated, then converted once to a RunConfig that
    everything below takes). ``extra_callbacks``: more Lightning callbacks (notebooks,
    probes), added after ours. One training per run dir (its lock, eagle3/training/run_dir.py);
    a damaged dataset is refused with the extract.py command that repairs it."""
    output_dir = Path(cfg.paths.output_dir)
    stage = StageClock()  # a time budget counts this run from here (its imports too, as an entrypoint)
    with run_dir_lock(output_dir):
        validate_run_config(cfg)
        if cfg.export.push_to_hub:  # the token and the Hub checked before any work, not after the training
            repo, private = str(cfg.export.push_to_hub), bool(cfg.export.hub_private)
            preflight(repo, private, key="export.push_to_hub", note="nothing was trained")
        # time_budget.minutes: extract.py's shares name the dataset (data.max_samples)
        try:
            run_cfg, _ = time_budget.sized(run_config(cfg))
        except time_budget.FixedCostsPastBudget:
            # the rates recorded since the plan (the extraction's own engine start among them) put
            # the fixed costs past the minutes: the plan was extract.py's, and the dataset's name does
            # not depend on it (time_budget.asked); training takes the clock as it finds it
            run_cfg = run_config(cfg)
        if global_rank() == 0:  # a rerun under another config does not resume this run dir's checkpoints
            run_dir.check_run_config(output_dir, run_cfg)
        try:
            return _run(run_cfg, output_dir, extra_callbacks, stage)
        except DamagedDatasetError as e:
            expected = dataset_path(
                dataset_identity(run_cfg, resolve_target(run_cfg.model, run_cfg.paths.cache_dir))
            ).name
            raise DamagedDatasetError(
                e.directory,
                e.problem,
                e.needs_hash,
                run_dir.repair_command(run_cfg.dataset_dir, e.directory, expected, e.needs_hash),
            ) from None


def _run(cfg: RunConfig, output_dir: Path, extra_callbacks: Sequence[L.Callback], stage: StageClock) -> float:
    """One training, in order: the dataset and step path, build, fit and validate, export and
    evaluate, the summary (rank 0 for the last three). Returns cfg.optimized_metric's value."""
    # ranks come from torchrun/srun, never from Lightning re-running the script (eagle3/util/launch.py)
    check_external_launch(cfg.topology.devices, cfg.topology.num_nodes)
    L.seed_everything(cfg.train.seed, workers=True, verbose=False)
    output_dir.mkdir(parents=True, exist_ok=True)
    target_dir = resolve_target(cfg.model, cfg.paths.cache_dir)
    online = cfg.train.hidden_states == HiddenStates.online
    dataset_dir = find_token_dataset(cfg, target_dir) if online else find_dataset(cfg, target_dir)
    run_dir.check_dataset(output_dir, cfg, dataset_dir)  # on every rank: a resume on other data is refused by all
    manifest = Manifest.read(dataset_dir)
    check_loss_fits_teacher(cfg, dataset_dir, manifest)
    selection_dir = None if online else find_selection(cfg, target_dir)
    if selection_dir is not None:  # optimized_metric's val/<name> read on the selection set
        cfg = dataclasses.replace(cfg, optimized_metric=picking_metric(cfg.optimized_metric, True))
        if global_rank() == 0:
            report([f"checkpoint selection: {cfg.optimized_metric} on the selection set {selection_dir}"])
    planned = cfg  # as a plan reads it: the rates recorded below are keyed by these settings, not those resolved
    clock = train_clock.train_clock(cfg, manifest.provenance.get("extract_seconds"), stage)
    if clock is not None:  # training gets what the extraction and the end of this run leave
        cfg = train_clock.timed_train(cfg, clock)
    path = resolve_step_path(cfg.train, cfg.topology)
    if global_rank() == 0:
        report([path.line()] + ([clock.line()] if clock else []))
    cfg = _as_run(cfg, path)  # auto/null replaced by what runs: what every record below says
    parts = build_parts(cfg, path, output_dir, target_dir, (dataset_dir, selection_dir), extra_callbacks)
    _report_cost(cfg, parts)
    # the checkpoints' disk before the first step, not after hours of it (sized before fit: FSDP
    # shards the live parameters); on every rank: ranks that share the disk agree, and none
    # waits at a barrier for one that refused
    kept, checkpoint_bytes = cfg.callbacks.model_checkpoint, parts.module.checkpoint_bytes()
    at_once = checkpoints_at_once(kept.save_top_k, kept.save_last)
    _, free = check_checkpoint_disk(output_dir / "checkpoints", checkpoint_bytes, at_once, kept.check_disk)
    if parts.trainer.is_global_zero:
        report(
            [
                f"checkpoints: {format_bytes(checkpoint_bytes)} each (weights and AdamW's moments), up to {at_once} at "
                f"once: {format_bytes(at_once * checkpoint_bytes)}; {format_bytes(free)} free there"
            ]
        )
    fit_start, push_failed, eval_failed, started_s = time.monotonic(), None, None, stage.seconds()
    initial, final = _fit_and_validate(cfg, parts, output_dir / "checkpoints")
    if parts.trainer.is_global_zero:
        summary = _summary(cfg, parts, dataset_dir, target_dir, initial, final)
        summary["checkpoint_bytes"] = checkpoint_bytes
        # this process's fit and last validation (a resumed run: its last part), and where: the model card's
        summary["fit_seconds"] = round(time.monotonic() - fit_start, 1)
        summary["machine"] = machine_record(cfg.topology.accelerator, cfg.topology.devices, cfg.topology.num_nodes)
        fit = report_fit(
            parts.trainer,
            parts.datamodule,
            parts.logger,
            summary,
            planned_passes=cfg.time_budget.passes if clock else None,
        )
        eval_start = time.monotonic()
        export_dir, carried = _export_and_evaluate(cfg, parts, output_dir, dataset_dir, target_dir, summary)
        from eagle3.stages.evaluate import note_evaluation_failure  # the evaluate stage, loaded only here

        eval_failed = note_evaluation_failure(summary, export_dir)
        # this machine's rates, keyed by the settings as planned: the next budget here plans from them
        eval_s = time.monotonic() - eval_start if cfg.eval.enabled and not eval_failed else None
        # a stage inside a longer process (polish.py's rounds) did not start one: no start_s from it
        start_s = started_s if stage.counts_process_start else None
        machine_rates.record(planned, {"train_tok_s": fit.tok_s or None, "start_s": start_s, "eval_s": eval_s})
        if clock is not None:
            summary["time_budget"] = clock.outcome()
            report([train_clock.outcome_line(summary["time_budget"])])
        push_failed = _write_summary(output_dir, export_dir, summary, cfg.export, carried)
        if eval_failed:  # the last line: an exit 0 with no acceptance measured says why
            say([eval_failed])
    _finish_logger(parts, initial)
    if parts.trainer.is_global_zero and push_failed:  # the export, the card and the logs are whole first
        raise HubPushError(push_failed)
    if eval_failed:  # rank 0's, after everything above is written
        from eagle3.stages.evaluate import require_evaluation

        require_evaluation(cfg.eval, eval_failed)
    return final.get(cfg.optimized_metric, float("nan"))


def _as_run(cfg: RunConfig, path: StepPath) -> RunConfig:
    """cfg with the step path's settled values for topology.precision, train.attention and
    train.compile: what W&B, the checkpoint's hyper_parameters and the cost lines record."""
    return dataclasses.replace(
        cfg,
        train=dataclasses.replace(cfg.train, attention=path.attention, compile=path.compile),
        topology=dataclasses.replace(cfg.topology, precision=path.precision),
    )


def _report_cost(cfg: RunConfig, parts: TrainParts) -> None:
    """What this run will cost, before the first step (rank 0)."""
    if parts.trainer.is_global_zero:
        dm = parts.datamodule
        train_tokens = int(sum(dm.dataset.lengths[i] for i in dm.train_idx))
        report(train_lines(cfg, train_tokens, len(dm.train_batches)))


def _fit_and_validate(cfg: RunConfig, parts: TrainParts, ckpt_dir: Path) -> tuple[dict[str, float], dict[str, float]]:
    """(initial, final) val metrics: a fresh run validates before its first step, a resumed one
    continues from its checkpoint (ckpt_path). last.ckpt is saved, and an online target's memory
    given back (before evaluation loads vLLM)."""
    trainer, module, datamodule = parts.trainer, parts.module, parts.datamodule
    resume = _resolve_ckpt(cfg.ckpt_path, ckpt_dir)
    initial: dict[str, float] = {}
    if resume is None and datamodule.val_set_names:
        initial = _scalars(trainer.validate(module, datamodule=datamodule, verbose=False)[0])
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume)
    # the last train/* figures (tokens/s, peak GPU memory, loss): a validate() below resets them
    trained = {k: v for k, v in _scalars(trainer.callback_metrics).items() if k.startswith("train/")}
    # a rerun resumed at its last step trained nothing: validate, so the summary is this head's
    stale = trainer.global_step % cfg.train.val_check_interval != 0
    if datamodule.val_set_names and (stale or cfg.optimized_metric not in trainer.callback_metrics):
        trainer.validate(module, datamodule=datamodule, verbose=False)
        keep_final_if_best(parts.checkpoint, trainer)  # a fit stopped between validations: its last head
    final = {**trained, **_scalars(trainer.callback_metrics)}
    trainer.save_checkpoint(ckpt_dir / "last.ckpt", weights_only=False)  # a resume point: optimizer state too
    if datamodule.online is not None:
        datamodule.online.close()
    return initial, final


def _summary(
    cfg: RunConfig,
    parts: TrainParts,
    dataset_dir: Path,
    target_dir: str,
    initial: dict[str, float],
    final: dict[str, float],
) -> dict[str, Any]:
    checkpoint = parts.checkpoint
    best = checkpoint.best_model_score
    return {
        "dataset_dir": str(dataset_dir),
        "target_dir": str(target_dir),
        "global_step": parts.trainer.global_step,
        "initial": initial,
        "regen_engine": parts.datamodule.dataset.manifest.provenance.get("regen_engine"),
        "hidden_states": cfg.train.hidden_states.value,
        "final": final,
        "best_checkpoint": checkpoint.best_model_path or None,
        "best_metric": cfg.optimized_metric,
        "best_metric_value": float(best) if best is not None else None,
    }


def _export_and_evaluate(
    cfg: RunConfig, parts: TrainParts, output_dir: Path, dataset_dir: Path, target_dir: str, summary: dict[str, Any]
) -> tuple[Path, list[str]]:
    """The export of the best checkpoint (else last.ckpt), and vLLM's acceptance of it, into
    ``summary``; returns the export directory and what its owner carried over from a previous
    export there (eagle3/serving/export_dir.py). From the checkpoint file, not the live module: the
    same path as `python export.py`, and correct under FSDP (whose live parameters are shards)."""
    best = parts.checkpoint.best_model_path or output_dir / "checkpoints" / "last.ckpt"
    written = write_export(*checkpoint_head(best), output_dir / "export")
    export_dir = written.directory
    summary["export_dir"] = str(export_dir)
    from eagle3.stages.evaluate import evaluate_trained  # the evaluate stage, loaded only here

    summary["acceptance"] = evaluate_trained(cfg, export_dir, dataset_dir, target_dir, parts.logger)
    return export_dir, written.lines


def _write_summary(
    output_dir: Path,
    export_dir: Path,
    summary: Mapping[str, Any],
    export: ExportConfig | None = None,
    carried: Sequence[str] = (),
) -> str | None:
    """summary.json, then the export's publish step (eagle3/serving/export_dir.py: its training
    record, the advice on the acceptance just measured, the card, the upload to export.push_to_hub),
    then the lines: what the export carried over (``carried``), the `vllm serve` command with the
    advised number of draft tokens and, last, the export directory (scripts read it). Returns why
    the upload failed (raised once the logger is closed)."""
    write_text(output_dir / "summary.json", json.dumps(summary, indent=2))  # never a torn one (sweep tables read it)
    exported = summary.get("best_checkpoint") or output_dir / "checkpoints" / "last.ckpt"
    repo = export.push_to_hub if export is not None else None
    published = publish_export(
        export_dir,
        run_dir=output_dir,
        acceptance_file=(summary.get("acceptance") or {}).get("json"),
        target_dir=summary.get("target_dir"),
        push_to_hub=repo,
        hub_private=bool(export and export.hub_private),
        hub_key="export.push_to_hub",
        retry=f"python export.py ckpt={exported} out={export_dir} push_to_hub={repo}",
    )
    line = best_metric_line(summary.get("best_metric"), summary.get("best_metric_value"))
    # to stdout and train.log alike: the serve command is what a reader of the log looks for
    summary_lines = [f"summary: {output_dir / 'summary.json'}"] + ([line] if line else [])
    say(summary_lines + list(carried) + published.lines + [str(export_dir)])
    return published.push_failed


def best_metric_line(name: str | None, value: float | None) -> str | None:
    """The exported head's figure, with how far that figure has been from vLLM where measured."""
    if name is None or value is None:
        return None
    agreement = MEASURED_AGAINST_VLLM.get(name)
    return f"best {name}: {value:.3f}" + (f" ({agreement.describe()})" if agreement else "")


def _finish_logger(parts: TrainParts, initial: Mapping[str, float]) -> None:
    if parts.logger and parts.trainer.is_global_zero:  # other ranks hold a dummy W&B experiment
        parts.logger.experiment.summary.update({f"initial/{k}": v for k, v in initial.items()})
        parts.logger.experiment.finish()  # one W&B run per job: close it before the next multirun job
