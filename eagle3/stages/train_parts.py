"""One training's pieces, as train.py's stage builds them: the data module (the training data
and the selection set), the head and its Lightning module, the logger, the callbacks and the
Lightning Trainer, on the step path the run settled."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from eagle3.config.choices import HiddenStates
from eagle3.config.schema import RunConfig, plain
from eagle3.config.training import TrainerConfig
from eagle3.draft.serving_format import DraftMeta
from eagle3.stages.train_inputs import online_target
from eagle3.store import Manifest
from eagle3.store.batch_options import BatchShape
from eagle3.target_model.quantization import served_quantization, vllm_name
from eagle3.training.builder import build_head, target_name
from eagle3.training.callbacks import build_callbacks
from eagle3.training.checkpoint_io import AtomicCheckpointIO
from eagle3.training.datamodule import Eagle3DataModule
from eagle3.training.loggers import build_logger
from eagle3.training.module import Eagle3LitModule
from eagle3.training.step_path import StepPath
from eagle3.util.atomic import write_text


@dataclass
class TrainParts:
    """One training's pieces, as _build makes them."""

    datamodule: Eagle3DataModule
    module: Eagle3LitModule
    draft_meta: DraftMeta
    logger: Any  # a WandbLogger, or False
    checkpoint: ModelCheckpoint  # the best by cfg.optimized_metric: the exported head
    trainer: L.Trainer


def build_parts(
    cfg: RunConfig,
    path: StepPath,
    output_dir: Path,
    target_dir: str,
    datasets: tuple[Path, Path | None],
    extra_callbacks: Sequence[L.Callback],
) -> TrainParts:
    """The data module over ``datasets`` (the training data, the selection set or None), head,
    Lightning module, logger, callbacks (``extra_callbacks`` after ours) and trainer of this
    run, on the step path ``path``."""
    datamodule = _datamodule(cfg, path, target_dir, *datasets)
    # what was trained on, kept with the run (for an online run, the only record of its samples)
    write_text(output_dir / "dataset_manifest.json", datamodule.dataset.manifest.to_json())
    head, draft_meta = build_head(
        cfg.head,
        cfg.train,
        cfg.model,
        target_dir,
        datamodule.dataset,
        attention=path.attention,
        target=target_name(cfg.model, target_dir, cfg.export.target_name_or_path),
        num_speculative_tokens=cfg.eval.num_draft_tokens,
    )
    draft_meta.serve_tensor_parallel_size = int(cfg.topology.extract_tp)  # the target's TP in extraction
    # the target it was trained against: --quantization of the serve line, the evaluation's engines, the card
    draft_meta.serve_quantization = vllm_name(cfg.model.quantization)
    draft_meta.served_target = served_quantization(cfg.model.quantization, target_dir).to_dict()
    module = Eagle3LitModule(
        head,
        cfg.train,  # settled: the step compiles by it, and the checkpoint records it
        export_meta=draft_meta.to_dict(),
        replay_draft_tokens=cfg.eval.num_draft_tokens,
        replay_max_answer_tokens=cfg.eval.max_new_tokens,
    )
    logger = build_logger(
        cfg.logger,
        output_dir,
        plain(cfg),
        model_name=cfg.model.name,
        data_name=cfg.data.name,
        tags=cfg.tags,
        job_type=cfg.task_name,
    )
    checkpoint, callbacks = build_callbacks(
        cfg.callbacks,
        cfg.optimized_metric,
        output_dir / "checkpoints",
        max_steps=cfg.train.max_steps,
        with_logger=bool(logger),
        progress_bar=cfg.trainer.enable_progress_bar,
    )
    trainer = _trainer(cfg, path, logger, [*callbacks, *extra_callbacks], output_dir)
    return TrainParts(datamodule, module, draft_meta, logger, checkpoint, trainer)


def _datamodule(
    cfg: RunConfig, path: StepPath, target_dir: str, dataset_dir: Path, selection_dir: Path | None
) -> Eagle3DataModule:
    online = cfg.train.hidden_states == HiddenStates.online
    # the dataset's layer ids are the one source: the head and the export declare them, the
    # online target captures them
    layer_ids = Manifest.read(dataset_dir).layer_ids if online else []
    return Eagle3DataModule(
        str(dataset_dir),
        shape=BatchShape(cfg.train.max_tokens_per_batch, path.row_tokens, path.fixed_shape),
        seed=cfg.train.seed,
        num_workers=cfg.train.num_workers,
        read_ahead=cfg.train.read_ahead,
        online=online_target(cfg, target_dir, path.fixed_shape, path.row_tokens, layer_ids) if online else None,
        pin_memory=path.cuda,
        selection_dir=str(selection_dir) if selection_dir else None,
    )


def _trainer(cfg: RunConfig, path: StepPath, logger: Any, callbacks: list[L.Callback], output_dir: Path) -> L.Trainer:
    topo = cfg.topology
    return L.Trainer(
        accelerator=topo.accelerator,
        devices=topo.devices,
        num_nodes=topo.num_nodes,
        strategy=topo.strategy.value,
        precision=cast(Any, path.precision),  # a config string: Lightning checks it
        max_steps=cfg.train.max_steps,
        max_time=cfg.train.max_time,
        max_epochs=cfg.train.max_epochs if cfg.train.max_epochs else -1,
        # validate every n optimizer steps, across epoch boundaries
        val_check_interval=cfg.train.val_check_interval * cfg.train.accumulate_grad_batches,
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


def trainer_arguments(trainer_cfg: TrainerConfig) -> dict[str, Any]:
    """trainer.* as L.Trainer keyword arguments: the set ones."""
    return {k: v for k, v in dataclasses.asdict(trainer_cfg).items() if v is not None}
