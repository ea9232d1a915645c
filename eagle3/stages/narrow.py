"""The whole config narrowed to what the layers below need: the dataset's identity (what a dataset is
made of, so extract.py names it and train.py finds it) and the machine the target answers on."""

from __future__ import annotations

from eagle3.config.schema import RunConfig
from eagle3.extraction.identity import DatasetIdentity
from eagle3.extraction.samples import RegenMachine
from eagle3.planning import time_budget
from eagle3.store.storage_format import StorageFormat


def dataset_identity(cfg: RunConfig, target_dir: str) -> DatasetIdentity:
    """``cfg``'s dataset: its target (materialised in ``target_dir``), data, layers and dtype.
    Under a time budget the data holds the shares' count (what is rendered) but the name holds
    the budget as asked (time_budget.asked): the same name from either stage, whatever the rates."""
    return DatasetIdentity(
        model=cfg.model,
        target_dir=str(target_dir),
        data=cfg.data,
        layer_ids=tuple(int(i) for i in cfg.layers.layer_ids),
        capture_dtype=cfg.capture.dtype,
        datasets_dir=str(cfg.paths.datasets_dir),
        cache_dir=str(cfg.paths.cache_dir),
        named_by=time_budget.asked(cfg),
        storage=StorageFormat.from_config(cfg.capture),  # the one place the stages build it
    )


def regen_machine(cfg: RunConfig) -> RegenMachine:
    """Where regeneration runs: the capture group's engine memory and the extraction TP size."""
    return RegenMachine(
        cpu_kvcache_space_gb=cfg.capture.cpu_kvcache_space_gb,
        gpu_memory_utilization=cfg.capture.gpu_memory_utilization,
        tensor_parallel_size=cfg.topology.extract_tp,
    )
