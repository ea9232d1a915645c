"""train.py's stage: find the dataset of this config, train the head, export it, report."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Mapping, cast

import lightning as L
from omegaconf import DictConfig

from eagle3.config.schema import HiddenStates, RunConfig, Strategy, TrainerConfig, run_config
from eagle3.extraction.identity import DatasetNotFound, dataset_path, locate_dataset, regen_note
from eagle3.stages.cost import train_lines
from eagle3.stages.validate import torch_dtype, validate_run_config
from eagle3.store import DamagedDatasetError, Manifest
from eagle3.target.resolve import resolve_target
from eagle3.training.builder import build_head
from eagle3.training.callbacks import build_callbacks
from eagle3.training.checkpoint_io import AtomicCheckpointIO, export_checkpoint, newest_whole_checkpoint
from eagle3.training.datamodule import Eagle3DataModule
from eagle3.training.loggers import build_logger
from eagle3.training.module import Eagle3LitModule
from eagle3.training.online import OnlineHiddenStates
from eagle3.training.run_dir import repair_command, run_dir_lock
from eagle3.training.step_path import resolve_step_path, trains_on_cuda, uses_flex
from eagle3.util.atomic import write_text
from eagle3.util.launch import check_external_launch
from eagle3.util.report import report


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
    with run_dir_lock(output_dir):
        validate_run_config(cfg)
        run_cfg = run_config(cfg)
        try:
            return _run(run_cfg, output_dir, extra_callbacks)
        except DamagedDatasetError as e:
            expected = dataset_path(run_cfg, resolve_target(run_cfg.model, run_cfg.paths.cache_dir)).name
            raise DamagedDatasetError(
                e.directory, e.problem, e.needs_hash, repair_command(run_cfg, e.directory, expected, e.needs_hash)
            ) from None


def _run(cfg: RunConfig, output_dir: Path, extra_callbacks: Sequence[L.Callback]) -> float:
    # ranks come from torchrun/srun, never from Lightning re-running the script (eagle3/util/launch.py)
    check_external_launch(cfg.topology.devices, cfg.topology.num_nodes)
    L.seed_everything(cfg.train.seed, workers=True, verbose=False)
    output_dir.mkdir(parents=True, exist_ok=True)
    model_dir = resolve_target(cfg.model, cfg.paths.cache_dir)
    online = cfg.train.hidden_states == HiddenStates.online
    ds_dir = find_token_dataset(cfg, model_dir) if online else find_dataset(cfg, model_dir)
    resolve_step_path(cfg)  # settles train.attention and train.compile in cfg, for all below
    # a compiled step sees one shape (no recompiles); flex tiles rows in 128-token blocks
    fixed_shape = bool(cfg.train.compile) or uses_flex(cfg)
    row_tokens = None if uses_flex(cfg) else cfg.train.row_tokens
    datamodule = Eagle3DataModule(
        str(ds_dir),
        max_tokens_per_batch=cfg.train.max_tokens_per_batch,
        seed=cfg.train.seed,
        num_workers=cfg.train.num_workers,
        fixed_shape=fixed_shape,
        row_tokens=row_tokens,
        online=online_target(cfg, model_dir, fixed_shape, row_tokens) if online else None,
        pin_memory=trains_on_cuda(cfg.topology),
    )
    # what was trained on, kept with the run (for an online run, the only record of its samples)
    write_text(output_dir / "dataset_manifest.json", datamodule.dataset.manifest.to_json())
    head, draft_meta = build_head(cfg, model_dir, datamodule.dataset)
    module = Eagle3LitModule(
        head,
        cfg.train,  # after resolve_step_path settled attention and compile
        export_meta=draft_meta.to_dict(),
        replay_draft_tokens=cfg.eval.num_draft_tokens,
        replay_max_answer_tokens=cfg.eval.max_new_tokens,
    )

    ckpt_dir = output_dir / "checkpoints"
    best_metric = cfg.optimized_metric  # the exported checkpoint is the best by it
    logger = build_logger(cfg, output_dir)
    checkpoint, callbacks = build_callbacks(
        cfg.callbacks,
        best_metric,
        ckpt_dir,
        max_steps=cfg.train.max_steps,
        with_logger=bool(logger),
        progress_bar=cfg.trainer.enable_progress_bar,
    )
    callbacks += list(extra_callbacks)
    topo = cfg.topology
    n_val = cfg.train.val_check_interval
    trainer = L.Trainer(
        accelerator=topo.accelerator,
        devices=topo.devices,
        num_nodes=topo.num_nodes,
        strategy=topo.strategy.value,
        precision=cast(Any, topo.precision),  # a config string: Lightning checks it
        max_steps=cfg.train.max_steps,
        max_time=cfg.train.max_time,
        max_epochs=cfg.train.max_epochs if cfg.train.max_epochs else -1,
        # validate every n optimizer steps, across epoch boundaries
        val_check_interval=n_val * cfg.train.accumulate_grad_batches,
        check_val_every_n_epoch=None,
        gradient_clip_val=cfg.train.grad_clip or None,
        accumulate_grad_batches=cfg.train.accumulate_grad_batches,
        logger=logger,
        callbacks=callbacks,
        default_root_dir=str(output_dir),
        use_distributed_sampler=False,
        plugins=[AtomicCheckpointIO()],  # a killed save leaves the previous checkpoint whole
        log_every_n_steps=cfg.logger.log_every_n_steps,
        enable_model_summary=False,
        **trainer_arguments(cfg.trainer),
    )
    if trainer.is_global_zero:  # what this run will cost, before the first step
        train_tokens = int(sum(datamodule.dataset.lengths[i] for i in datamodule.train_idx))
        report(train_lines(cfg, train_tokens, len(datamodule.train_batches)))
    resume = _resolve_ckpt(cfg.ckpt_path, ckpt_dir)
    initial: dict[str, float] = {}
    if resume is None and datamodule.val_idx:
        initial = _scalars(trainer.validate(module, datamodule=datamodule, verbose=False)[0])
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume)
    # a rerun resumed at its last step trained nothing: validate, so the summary is this head's
    if datamodule.val_idx and (trainer.global_step % n_val != 0 or best_metric not in trainer.callback_metrics):
        trainer.validate(module, datamodule=datamodule, verbose=False)
    final = _scalars(trainer.callback_metrics)
    trainer.save_checkpoint(ckpt_dir / "last.ckpt")
    if datamodule.online is not None:  # the target's memory back before evaluation loads vLLM
        datamodule.online.close()

    summary: dict[str, Any] = {
        "dataset_dir": str(ds_dir),
        "verifier_dir": str(model_dir),
        "global_step": trainer.global_step,
        "initial": initial,
        "regen_engine": datamodule.dataset.manifest.provenance.get("regen_engine"),
        "hidden_states": "online" if online else "offline",
        "final": final,
        "best_checkpoint": checkpoint.best_model_path or None,
        "best_metric": best_metric,
        "best_metric_value": float(checkpoint.best_model_score) if checkpoint.best_model_score is not None else None,
    }
    export_dir = None
    if trainer.is_global_zero:
        # from the checkpoint file, not the live module: the same path as `python -m
        # eagle3.export`, and correct under FSDP (whose live parameters are shards)
        export_dir = export_checkpoint(checkpoint.best_model_path or ckpt_dir / "last.ckpt", output_dir / "export")
        summary["export_dir"] = str(export_dir)
        from eagle3.stages.evaluate import evaluate_trained  # the evaluate stage, loaded only here

        summary["acceptance"] = evaluate_trained(cfg, export_dir, ds_dir, model_dir, logger)
        (output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print(f"summary: {output_dir / 'summary.json'}")
        for line in serve_lines(
            export_dir, draft_meta.verifier_name_or_path, draft_meta.num_speculative_tokens, summary
        ):
            print(line)
        print(str(export_dir))
    if logger and trainer.is_global_zero:  # other ranks hold a dummy W&B experiment
        logger.experiment.summary.update({f"initial/{k}": v for k, v in initial.items()})
        logger.experiment.finish()  # one W&B run per job: close it before the next multirun job
    return final.get(cfg.optimized_metric, float("nan"))


def trainer_arguments(trainer_cfg: TrainerConfig) -> dict[str, Any]:
    """trainer.* as L.Trainer keyword arguments: the set ones."""
    return {k: v for k, v in dataclasses.asdict(trainer_cfg).items() if v is not None}


def serve_lines(export_dir: Path, verifier: str, trained_k: int, summary: Mapping[str, Any]) -> list[str]:
    """The `vllm serve` command with the advised number of draft tokens, and the loads at which
    the head pays off: the rule on the acceptance per position just measured in vLLM
    (eagle3/evaluation/serving_advice.py; written to the export's serving.json)."""
    from eagle3.evaluation.serving_advice import advice_for, read_acceptance, serving_lines

    acceptance = read_acceptance((summary.get("acceptance") or {}).get("json"))
    return serving_lines(export_dir, verifier, trained_k, advice_for(export_dir, acceptance))


def online_target(cfg: RunConfig, model_dir: str, fixed_shape: bool, row_tokens: int | None) -> OnlineHiddenStates:
    """train.hidden_states=online: the frozen target each training process runs (a full copy
    per process), capturing the layers and dtype the dataset names."""
    if cfg.topology.strategy == Strategy.fsdp:
        raise ValueError(
            "train.hidden_states=online: expected topology.strategy auto or ddp (each process holds a "
            "whole copy of the target), got fsdp; for a target that needs sharding, extract the hidden "
            "states with capture=vllm and tensor parallelism and train offline (docs/scaling.md)"
        )
    print(f"hidden states: online, the target ({model_dir}) runs with transformers on each training device")
    return OnlineHiddenStates(
        model_dir,
        [int(i) for i in cfg.layers.capture_ids],
        cfg.model.hidden_size,
        torch_dtype(cfg.capture.dtype),
        max_tokens_per_batch=cfg.train.max_tokens_per_batch,
        row_tokens=row_tokens,
        fixed_shape=fixed_shape,
        forward_tokens=cfg.capture.max_tokens_per_batch,
        trust_remote_code=cfg.model.trust_remote_code,
    )


def find_token_dataset(cfg: RunConfig, model_dir: str) -> Path:
    """dataset_dir= as given (a token dataset), else this config's, written now if missing
    (the pre-pass: samples, split and vocabulary; `extract.py train.hidden_states=online`
    runs it alone)."""
    if cfg.dataset_dir:
        ds_dir = Path(cfg.dataset_dir).expanduser().resolve()
        if Manifest.read(ds_dir).hidden_states != "online":
            raise ValueError(
                f"dataset_dir={cfg.dataset_dir}: holds stored hidden states; train.hidden_states=online "
                "reads a token dataset (python extract.py train.hidden_states=online <same overrides>)"
            )
        return ds_dir
    from eagle3.extraction.tokens import prepare_token_dataset

    return prepare_token_dataset(cfg, model_dir)


def find_dataset(cfg: RunConfig, model_dir: str) -> Path:
    """dataset_dir= as given, checked against the config; else the fingerprinted directory
    (eagle3.extraction.identity.locate_dataset). Prints which engine wrote its answers."""
    if not cfg.dataset_dir:
        ds_dir, note = locate_dataset(cfg, model_dir)
        print(f"dataset {ds_dir}: {regen_note(Manifest.read(ds_dir))}" + (f" ({note})" if note else ""))
        return ds_dir
    ds_dir = Path(cfg.dataset_dir).expanduser().resolve()
    if not (ds_dir / "manifest.json").is_file():
        raise DatasetNotFound(
            f"dataset_dir={cfg.dataset_dir}: no manifest.json there (expected a directory extract.py wrote)"
        )
    manifest = Manifest.read(ds_dir)
    want_ids, want_hidden = [int(i) for i in cfg.layers.capture_ids], cfg.model.hidden_size
    if list(manifest.layer_ids) != want_ids or int(manifest.hidden_size) != want_hidden:
        raise ValueError(
            f"dataset_dir={cfg.dataset_dir}: holds layers {list(manifest.layer_ids)} of hidden size "
            f"{manifest.hidden_size}, but model={cfg.model.name} with these layers expects layers "
            f"{want_ids} of hidden size {want_hidden}"
        )
    print(f"dataset {ds_dir}: {regen_note(manifest)}")
    return ds_dir
