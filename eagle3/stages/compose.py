"""ConfigStore registration (``base_<group>``) and the ``eagle3.*`` OmegaConf resolvers."""

from __future__ import annotations

import json

from hydra.core.config_store import ConfigStore
from omegaconf import ListConfig, OmegaConf

from eagle3.config import schema
from eagle3.stages import disk_plan
from eagle3.target_model import layer_ids
from eagle3.target_model.hub import model_config_file
from eagle3.util import launch

_GROUPS = {
    "model": schema.ModelConfig,
    "topology": schema.TopologyConfig,
    "layers": schema.LayersConfig,
    "data": schema.DataConfig,
    "capture": schema.CaptureConfig,
    "train": schema.TrainConfig,
    "logger": schema.LoggerConfig,
    "paths": schema.PathsConfig,
    "trainer": schema.TrainerConfig,
    "callbacks": schema.CallbacksConfig,
}


def _plain(x):
    return OmegaConf.to_container(x, resolve=True) if OmegaConf.is_config(x) else x


def _model_fact(path: str, key: str, revision: str | None = None):
    """Read an architecture fact from the config.json of a `model=hf` target: a local directory,
    or a hub id's config.json at `revision` (only that file is fetched at compose time)."""
    cfg_file = model_config_file(path, revision)
    if not cfg_file.is_file():
        raise ValueError(
            f"model.path={path!r}: no config.json there to read {key!r} from; give a local HF "
            f"model directory or a hub id, or set the fact explicitly (e.g. model.num_layers=32)"
        )
    cfg = json.loads(cfg_file.read_text())
    cfg = cfg.get("text_config", cfg)  # multimodal wrappers keep the LM facts inside
    if key not in cfg:
        raise ValueError(f"{cfg_file}: has no {key!r}; set the matching model.* field explicitly")
    value = cfg[key]
    return value[0] if key == "architectures" and isinstance(value, list) else value


def sizes_source(sizes: str, accelerator: str) -> str:
    """The `sizes_source` entry: whether `sizes` is the topology's own (the gpu* topologies
    select sizes=gpu, the cpu* ones keep the primary configs' sizes=cpu) or one picked over it."""
    if sizes == accelerator:
        return f"topology.accelerator={accelerator}"
    return f"sizes={sizes} picked over topology.accelerator={accelerator}"


def register_resolvers() -> None:
    OmegaConf.register_new_resolver(
        "eagle3.aux_ids",
        lambda ids, numbering, n: ListConfig(layer_ids.resolve_aux_ids(_plain(ids), numbering, n)),
        replace=True,
    )
    OmegaConf.register_new_resolver(
        "eagle3.layer_ids",
        lambda ids, n: ListConfig(layer_ids.aux_and_final(_plain(ids), n)),
        replace=True,
    )
    OmegaConf.register_new_resolver("eagle3.model_fact", _model_fact, replace=True)
    OmegaConf.register_new_resolver("eagle3.sizes_source", sizes_source, replace=True)
    # the run dir's name: one value per process (cached), shared by all ranks of a launch
    OmegaConf.register_new_resolver("eagle3.run_id", lambda: launch.launch_run_id(), use_cache=True, replace=True)
    OmegaConf.register_new_resolver("eagle3.tasks_per_node", launch.tasks_per_node, replace=True)
    # what the capture stores, shown by --cfg job --resolve (eagle3/stages/disk_plan.py)
    OmegaConf.register_new_resolver(
        "eagle3.hidden_layout", lambda dtype, ids, h: disk_plan.hidden_layout(dtype, _plain(ids), h), replace=True
    )
    OmegaConf.register_new_resolver("eagle3.vllm_capture_route", disk_plan.vllm_capture_route, replace=True)
    OmegaConf.register_new_resolver(
        "eagle3.disk_per_million_tokens",
        lambda ids, h, dtype, shard: disk_plan.disk_per_million_tokens(_plain(ids), h, dtype, shard),
        replace=True,
    )


def register_configs() -> None:
    register_resolvers()
    cs = ConfigStore.instance()
    cs.store(name="base_run", node=schema.RunConfig)
    for group, node in _GROUPS.items():
        cs.store(group=group, name=f"base_{group}", node=node)
