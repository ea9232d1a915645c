"""ConfigStore registration (``base_<group>``) and the ``eagle3.*`` OmegaConf resolvers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf

from eagle3.config import cli, dataset, polish, schema, target, training
from eagle3.planning import disk_estimate
from eagle3.target_model import layer_ids
from eagle3.target_model.hub import model_config_file
from eagle3.util import launch

if TYPE_CHECKING:
    from eagle3.store.storage_format import StorageFormat

_GROUPS = {
    "model": target.ModelConfig,
    "topology": target.TopologyConfig,
    "layers": target.LayersConfig,
    "data": dataset.DataConfig,
    "capture": dataset.CaptureConfig,
    "head": training.HeadConfig,
    "train": training.TrainConfig,
    "logger": training.LoggerConfig,
    "paths": schema.PathsConfig,
    "trainer": training.TrainerConfig,
    "callbacks": training.CallbacksConfig,
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
        "eagle3.aux_layer_ids",
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
    # what the capture stores, shown by --cfg job --resolve (eagle3/planning/disk_estimate.py)
    OmegaConf.register_new_resolver(
        "eagle3.hidden_layout", lambda dtype, ids, h: disk_estimate.hidden_layout(dtype, _plain(ids), h), replace=True
    )
    OmegaConf.register_new_resolver(
        "eagle3.storage_layout",
        lambda dtype, ids, h, kind, k, vocab: disk_estimate.storage_layout(
            dtype, _plain(ids), h, _storage(kind, k), vocab
        ),
        replace=True,
    )
    OmegaConf.register_new_resolver("eagle3.default_storage", disk_estimate.default_storage, replace=True)
    OmegaConf.register_new_resolver("eagle3.default_teacher_topk", disk_estimate.default_teacher_topk, replace=True)
    OmegaConf.register_new_resolver(
        "eagle3.bytes_per_token",
        lambda ids, h, dtype, kind, k: disk_estimate.bytes_per_token(_plain(ids), h, dtype, _storage(kind, k)),
        replace=True,
    )
    OmegaConf.register_new_resolver(
        "eagle3.dataset_disk",
        lambda n, length, ids, h, dtype, shard, kind, k: disk_estimate.dataset_disk(
            n, length, _plain(ids), h, dtype, shard, _storage(kind, k)
        ),
        replace=True,
    )
    OmegaConf.register_new_resolver("eagle3.vllm_capture_route", disk_estimate.vllm_capture_route, replace=True)
    OmegaConf.register_new_resolver(
        "eagle3.checkpoint_disk",
        lambda model, head, ids, top_k, last: disk_estimate.checkpoint_disk(model, head, _plain(ids), top_k, last),
        replace=True,
    )
    OmegaConf.register_new_resolver(
        "eagle3.disk_per_million_tokens",
        lambda ids, h, dtype, shard, kind, k: disk_estimate.disk_per_million_tokens(
            _plain(ids), h, dtype, shard, _storage(kind, k)
        ),
        replace=True,
    )


def _storage(kind: str, teacher_topk: int | None) -> StorageFormat:
    """capture.storage and capture.teacher_topk as the store's one value, built where a resolver
    reads them (the store imports torch: only once a figure is resolved, composing stays light)."""
    from eagle3.store.storage_format import StorageFormat

    return StorageFormat(kind, teacher_topk)


def visible_gpus() -> int:
    """How many NVIDIA GPUs this process may use: CUDA_VISIBLE_DEVICES where it is set, else
    nvidia-smi's list (no torch import: `--help` and `--cfg job` stay fast)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0


def _given(args: list[str], key: str) -> str | None:
    """The value of ``key=...`` (or ``+key=`` / ``++key=``) among command-line overrides."""
    for a in args:
        name, sep, value = a.lstrip("+").partition("=")
        if sep and name == key:
            return value
    return None


def _accelerator(conf_dir: Path, topology: str) -> str | None:
    """conf/topology/<name>.yaml's accelerator, read without composing (None: not one file)."""
    from omegaconf import OmegaConf

    path = conf_dir / "topology" / f"{topology}.yaml"
    if "," in topology or not path.is_file():
        return None
    node = OmegaConf.load(path)
    return str(node.get("accelerator", "")) or None if isinstance(node, DictConfig) else None


def machine_overrides(args: list[str], conf_dir: str | Path, gpus: int | None = None) -> list[str]:
    """The overrides that make the defaults follow the machine, for a command line ``args``:
    ``topology=gpu1`` where a GPU answers and neither a topology nor an experiment preset is
    given (an experiment picks its own), and ``sizes=gpu`` where the topology runs on a GPU and
    neither sizes nor an experiment is given. Each choice is printed with why; anything on the
    command line wins."""
    if any(a in ("--help", "-h", "--hydra-help") or a.startswith("--info") for a in args):
        return []
    if _given(args, "experiment") is not None:
        return []
    added: list[str] = []
    topology = _given(args, "topology")
    if topology is None:
        n = visible_gpus() if gpus is None else gpus
        if n > 0:
            topology = "gpu1"
            added.append("topology=gpu1")
            more = f"; topology=gpu{n}_tp{n} for all {n}" if n in (2, 4, 8) else ""
            print(
                f"[eagle3] {n} GPU(s) answered: topology=gpu1 (one GPU{more}; topology=cpu for the CPU)",
                file=sys.stderr,
            )
    if topology is not None and _given(args, "sizes") is None and _accelerator(Path(conf_dir), topology) == "gpu":
        added.append("sizes=gpu")
        print(f"[eagle3] sizes=gpu: topology={topology} runs on a GPU (sizes=cpu for the CPU sizes)", file=sys.stderr)
    return added


def follow_the_machine(conf_dir: str | Path) -> None:
    """Put machine_overrides on this process's command line (the entrypoints call it before
    Hydra parses sys.argv), first: overrides after a flag such as --resolve would not parse."""
    sys.argv[1:1] = machine_overrides(sys.argv[1:], conf_dir)


def register_configs() -> None:
    register_resolvers()
    cs = ConfigStore.instance()
    cs.store(name="base_run", node=schema.RunConfig)
    for group, node in _GROUPS.items():
        cs.store(group=group, name=f"base_{group}", node=node)


def register_evaluate_config() -> None:
    """``base_evaluate`` (conf/evaluate.yaml extends it) and the shared groups it uses."""
    register_configs()  # the shared groups (paths, logger) and resolvers
    ConfigStore.instance().store(name="base_evaluate", node=cli.EvaluateConfig)


def register_export_config() -> None:
    """``base_export``: conf/export.yaml extends it."""
    ConfigStore.instance().store(name="base_export", node=cli.ExportCliConfig)


def register_polish_config() -> None:
    """``base_polish`` (conf/polish.yaml extends it) and the shared groups it uses."""
    register_configs()
    ConfigStore.instance().store(name="base_polish", node=polish.PolishRunConfig)


def register_replay_export_config() -> None:
    """``base_replay_export``: conf/replay_export.yaml extends it."""
    ConfigStore.instance().store(name="base_replay_export", node=cli.ReplayExportConfig)
