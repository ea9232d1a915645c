"""Checks that need more than one field (the schemas catch typos and types at compose).

They read the composed DictConfig, before the stages convert it to a RunConfig: converting
resolves the computed fields, whose resolvers would fail first, naming less."""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf

from eagle3.config.errors import ConfigError
from eagle3.config.schema import refuse_unknown_keys
from eagle3.draft.config import NORM_OPTIONS, DraftConfigError, check_norm_options
from eagle3.util import hidden_dtypes


def config_torch_dtype(name: str, key: str = "capture.dtype") -> torch.dtype:
    """eagle3.util.hidden_dtypes.torch_dtype, failing as a ConfigError."""
    try:
        return hidden_dtypes.torch_dtype(name, key)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def validate_topology(topology: DictConfig) -> None:
    for key in ("devices", "num_nodes", "extract_tp", "extract_dp"):
        if int(topology[key]) < 1:
            raise ConfigError(f"topology.{key}: expected >= 1, got {topology[key]}")
    world = int(topology.devices) * int(topology.num_nodes)
    need = int(topology.extract_tp) * int(topology.extract_dp)
    if need > world:
        raise ConfigError(
            f"topology: extract_tp x extract_dp = {topology.extract_tp} x {topology.extract_dp} = {need} "
            f"devices, but devices x num_nodes = {topology.devices} x {topology.num_nodes} = {world}"
        )
    if str(topology.accelerator) not in ("cpu", "gpu", "cuda", "auto"):
        raise ConfigError(f"topology.accelerator: expected cpu|gpu|auto, got {topology.accelerator!r}")


# what every sizes preset (conf/sizes/*.yaml) sets and the schema leaves unset
_SIZE_KEYS = (
    "sizes",
    "data.max_length",
    "train.lr",
    "train.warmup_steps",
    "train.max_steps",
    "train.max_tokens_per_batch",
    "train.val_check_interval",
)


def _missing(cfg: DictConfig, key: str) -> bool:
    *parents, name = key.split(".")
    node = cfg
    for parent in parents:
        node = node[parent]
    return OmegaConf.is_missing(node, name)


def validate_run_config(cfg: DictConfig) -> None:
    """Everything a stage checks before doing any work."""
    refuse_unknown_keys(cfg)
    # the run sizes have no schema default: without a sizes preset the first of them would fail alone
    unset = [k for k in _SIZE_KEYS if _missing(cfg, k)]
    if unset:
        raise ConfigError(
            f"no run size for {', '.join(unset)}: they come from conf/sizes/<name>.yaml "
            f"(sizes=cpu or sizes=gpu), or set each on the command line"
        )
    validate_topology(cfg.topology)
    config_torch_dtype(cfg.capture.dtype)
    # resolving these runs the layer-id validation (range, unique, sorted)
    list(cfg.layers.layer_ids)
    if not 0.0 <= float(cfg.data.val_fraction) < 1.0:
        raise ConfigError(f"data.val_fraction: expected in [0, 1), got {cfg.data.val_fraction}")
    answers = int(cfg.data.regen_num_answers)
    if answers < 1:
        raise ConfigError(f"data.regen_num_answers: expected >= 1, got {answers}")
    if answers > 1 and cfg.data.regenerate and float(cfg.data.regen_temperature) <= 0:
        raise ConfigError(
            f"data.regen_num_answers={answers} with data.regen_temperature={cfg.data.regen_temperature}: greedy "
            "answers to one prompt are all the same; set data.regen_temperature > 0 (e.g. 0.7) or one answer"
        )
    if int(cfg.data.max_length) < 2:
        raise ConfigError(f"data.max_length: expected >= 2, got {cfg.data.max_length}")
    if int(cfg.train.ttt_steps) < 1:
        raise ConfigError(f"train.ttt_steps: expected >= 1, got {cfg.train.ttt_steps}")
    if float(cfg.train.feature_noise) < 0:
        raise ConfigError(
            f"train.feature_noise: expected >= 0 (a fraction of each state's RMS), got {cfg.train.feature_noise}"
        )
    if not 0.0 <= float(cfg.train.onpolicy_weight) <= 1.0:
        raise ConfigError(f"train.onpolicy_weight: expected a value in [0, 1], got {cfg.train.onpolicy_weight}")
    if not 0.0 <= float(cfg.train.onpolicy_decay) <= 1.0:
        raise ConfigError(f"train.onpolicy_decay: expected a value in [0, 1], got {cfg.train.onpolicy_decay}")
    for key in ("num_workers", "read_ahead"):
        if int(cfg.train[key]) < 0:
            raise ConfigError(f"train.{key}: expected >= 0, got {cfg.train[key]}")
    if int(cfg.head.num_draft_layers) < 1:
        raise ConfigError(f"head.num_draft_layers: expected >= 1, got {cfg.head.num_draft_layers}")
    if int(cfg.head.draft_vocab_size) < 1:
        raise ConfigError(f"head.draft_vocab_size: expected >= 1, got {cfg.head.draft_vocab_size}")
    try:  # the head's own check, before any work rather than when the head is built
        check_norm_options({name: bool(cfg.head[name]) for name in NORM_OPTIONS}, where="head")
    except DraftConfigError as e:
        raise ConfigError(str(e)) from None
    metric = str(cfg.optimized_metric)
    if not metric.startswith("val/"):
        raise ConfigError(
            f"optimized_metric: expected a validation metric (val/replay_accept_len, "
            f"val/sim_accept_len, val/loss, ...), got {metric!r}"
        )
    if metric.startswith("val/replay") and int(cfg.eval.num_draft_tokens) < 1:
        raise ConfigError(
            f"optimized_metric={metric}: the replay needs eval.num_draft_tokens >= 1 (its K), "
            f"got {cfg.eval.num_draft_tokens}"
        )
    validate_quantization(cfg)
    if not 0 <= int(cfg.shard_index) < int(cfg.num_shards):
        raise ConfigError(f"shard_index: expected 0..num_shards-1={int(cfg.num_shards) - 1}, got {cfg.shard_index}")


def validate_quantization(cfg: DictConfig) -> None:
    """model.quantization runs only in vLLM: a route that runs the target through transformers
    (the HF capture, the HF regeneration, the trainer's own copy of an online run) would train the
    head against another target than the served one, silently. Refused here, naming the vLLM route."""
    from eagle3.target_model.quantization import hf_route_refusal, vllm_name

    quantization = cfg.model.quantization
    if vllm_name(quantization) is None:  # null or none: the checkpoint as it is
        return
    from eagle3.target_model.generate.common import resolve_backend  # only where the routes matter

    if _value(cfg.train.hidden_states) == "online":
        raise ConfigError(
            hf_route_refusal(
                "train.hidden_states=online", quantization, "train.hidden_states=offline with capture=vllm"
            )
        )
    if _value(cfg.capture.backend) == "hf":
        raise ConfigError(hf_route_refusal("capture=hf", quantization, "capture=vllm"))
    if cfg.data.regenerate and resolve_backend(cfg.data.regen_backend) == "hf":
        route = (
            "data.regen_backend=hf"
            if _value(cfg.data.regen_backend) == "hf"
            else "data.regen_backend=auto (vLLM does not import here)"
        )
        raise ConfigError(hf_route_refusal(route, quantization, "data.regen_backend=vllm on a machine with vLLM"))


def _value(node: object) -> str:
    """An enum field's value as the YAML writes it."""
    return str(getattr(node, "value", node))
