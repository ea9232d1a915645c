"""The serving format, both ways: a head to the directory speculators 0.9 and vLLM 0.32 load
(save_head) and that directory back to a head (load_head).

    <export>/config.json        speculators' Eagle3SpeculatorConfig (speculators_config_dict)
    <export>/model.safetensors  the head's tensors under serving names, bf16 (export_state_dict)
    <export>/eagle3_meta.json   the DraftConfig and aux ids as trained (ours; vLLM ignores it)

Tensors (vLLM llama_eagle3 `load_weights` + speculators Eagle3DraftModel); H hidden size,
A aux layers, I intermediate size, q/kv = heads x head_dim, V draft vocab, Vt target vocab:
    fc.weight                                        [H, A*H]
    layers.0.self_attn.{q,k,v}_proj.weight           [q|kv|kv, 2H]  (embeds ++ hidden in)
    layers.0.self_attn.o_proj.weight                 [H, q]
    layers.0.mlp.{gate,up}_proj.weight               [I, H];  down_proj [H, I]
    layers.0.{input_layernorm,hidden_norm,post_attention_layernorm}.weight   [H]
    norm.weight [H], lm_head.weight [V, H], d2t int64 [V], t2d bool [Vt]
    [input_norm.weight [A*H] if norm_before_fc], [fc_norm.{i}.weight [H] for each aux layer i
    if fc_norm], [embed_tokens.weight [Vt, H]];
    with num_layers > 1 also layers.i.{self_attn.*, mlp.*, input_layernorm, post_attention_layernorm}
    for i >= 1, q/k/v taking [*, H] (no hidden_norm: those layers see the hidden stream only).
Our module uses the same names; the frozen target copies (target_norm, target_lm_head) are
training-only and never exported (speculators drops its verifier_* copies the same way).

config.json: what speculators' Eagle3SpeculatorConfig serialises (checked in
tests/unit/draft/test_draft_parity.py), with the norm flags vLLM reads (config.NORM_OPTIONS) written
from the head's config. vLLM assumes norm_before_residual=True when the key is missing, so
every flag is always written, and load_head reads a missing one as vLLM does.

Plain torch and safetensors (no lightning, no hydra): the target's config and frozen
weights come in as arguments, read by the caller (eagle3.target_model).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Optional

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from eagle3.draft.config import VLLM_NORM_DEFAULTS, DraftConfig
from eagle3.draft.export_files import CONFIG, EXPORT_FILES, WEIGHTS
from eagle3.draft.head import Eagle3DraftHead
from eagle3.util.atomic import TMP_MARK, atomic_dir
from eagle3.util.file_mode import apply_umask

SPECULATORS_VERSION = "0.9.0"
_TRAINING_ONLY_PREFIXES = ("target_norm.", "target_lm_head.")


def export_state_dict(
    head: nn.Module, *, include_embed_tokens: bool = False, dtype: torch.dtype | None = torch.bfloat16
) -> dict[str, torch.Tensor]:
    """The head's weights under serving names, contiguous CPU tensors (float ones cast to dtype).

    d2t (int64) and t2d (bool) keep their dtypes. embed_tokens is the target's own (frozen)
    copy, so it is left out unless it was trained (vLLM then shares the target's).
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in head.state_dict().items():
        if name.startswith(_TRAINING_ONLY_PREFIXES):
            continue
        if name.startswith("embed_tokens.") and not include_embed_tokens:
            continue
        t = tensor.detach().to("cpu")
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[name] = t.contiguous()
    return out


class NonFiniteWeightsError(ValueError):
    """A tensor about to be exported holds a NaN or an Inf (a diverged training, or a weight
    beyond bf16's range): the export is refused and the previous one left in place."""


def check_finite(weights: Mapping[str, torch.Tensor], where: str) -> None:
    """Raise NonFiniteWeightsError naming the first floating tensor of ``weights`` (as it would be
    written, bf16 included) that holds a NaN or an Inf; ``where``: the file it was for."""
    for name, t in weights.items():
        if not t.is_floating_point():
            continue
        finite = torch.isfinite(t)
        if bool(finite.all()):
            continue
        bad = int((~finite).sum())
        first = float(t.flatten()[int((~finite).flatten().nonzero()[0, 0])])
        raise NonFiniteWeightsError(
            f"{where}: {name}: expected finite weights, got {bad} non-finite of {t.numel()} ({first} first, "
            f"{t.dtype}); the training diverged (or a weight overflows {t.dtype}): nothing was exported"
        )


def load_export_state_dict(head: nn.Module, weights: dict[str, torch.Tensor], where: str) -> None:
    """The reverse of export_state_dict: copy an export's tensors into `head` (float ones as
    fp32). Refuses a tensor the head lacks, a trained one the export lacks, and a wrong shape,
    naming `where` (the file) in the error; the frozen target copies may be absent."""
    cast = {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}
    try:
        missing, unexpected = head.load_state_dict(cast, strict=False)
    except RuntimeError as e:  # shape mismatches
        raise ValueError(f"{where}: {str(e).splitlines()[-1].strip()}") from e
    frozen = {n for n, p in head.named_parameters() if not p.requires_grad} | {n for n, _ in head.named_buffers()}
    if unexpected or set(missing) - frozen:
        raise ValueError(f"{where} (missing {sorted(set(missing) - frozen)[:5]}, unexpected {unexpected[:5]})")


def transformer_layer_config_dict(cfg: DraftConfig) -> dict[str, Any]:
    """The Llama decoder-layer config (transformers-5 keys) vLLM builds the draft layer from."""
    return {
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": cfg.hidden_act,
        "num_hidden_layers": cfg.num_layers,
        "vocab_size": cfg.target_vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_parameters": cfg.rope_parameters,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": cfg.initializer_range,
    }


def speculators_config_dict(
    draft_cfg: DraftConfig,
    aux_layer_ids: list[int],
    target_name_or_path: str,
    num_speculative_tokens: int,
    *,
    target_architectures: list[str] | None = None,
) -> dict[str, Any]:
    """config.json for the export directory.

    aux_layer_ids: vLLM numbering (id k = state entering decoder layer k), exactly what
    vLLM's `eagle_aux_hidden_state_layer_ids` means.
    """
    aux_layer_ids = [int(i) for i in aux_layer_ids]
    if len(aux_layer_ids) != draft_cfg.num_aux_layers:
        raise ValueError(
            f"speculators_config_dict: {len(aux_layer_ids)} aux layer ids {aux_layer_ids} but the draft "
            f"was built for num_aux_layers={draft_cfg.num_aux_layers}"
        )
    if num_speculative_tokens < 1:
        raise ValueError(f"speculators_config_dict: num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": transformer_layer_config_dict(draft_cfg),
        "draft_vocab_size": draft_cfg.draft_vocab_size,
        "eagle_aux_hidden_state_layer_ids": aux_layer_ids,
        **draft_cfg.norm_options,
        "embed_requires_grad": False,
        "target_hidden_size": None,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": int(num_speculative_tokens),
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "verifier": {
                "name_or_path": str(target_name_or_path),
                "architectures": list(target_architectures or []),
            },
        },
    }


@dataclass
class DraftMeta:
    """What the export needs besides weights (also stored in every checkpoint)."""

    draft_config: DraftConfig
    aux_layer_ids: list[int]
    target_name_or_path: str
    target_architectures: list[str]
    num_speculative_tokens: int
    # how the target ran in extraction, so the printed `vllm serve` command starts it the same way
    # (--tensor-parallel-size, --trust-remote-code); a checkpoint without them: 1 and false
    serve_tensor_parallel_size: int = 1
    serve_trust_remote_code: bool = False
    # model.quantization as vLLM names it (--quantization; the evaluation's engines); None: none
    serve_quantization: Optional[str] = None
    # what the served target runs in, the flag's or the checkpoint's own quantization_config
    # (eagle3/target_model/quantization.py ServedQuantization.to_dict); None: not recorded
    served_target: Optional[dict[str, Any]] = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["draft_config"] = self.draft_config.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DraftMeta":
        d = dict(d)
        d["draft_config"] = DraftConfig.from_dict(d["draft_config"])
        return cls(**d)


class ExportDirError(ValueError):
    """``out`` is a directory that is neither empty nor a previous export: replacing it would
    delete files the export did not write."""


def check_export_dir(out_dir: Path) -> None:
    """Refuse an ``out_dir`` whose contents an export would destroy: accepted are a missing or
    empty directory and a previous export (config.json of speculators_model_type eagle3 and
    model.safetensors) holding only EXPORT_FILES (and atomic writes' temps)."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ExportDirError(f"out={out_dir}: expected a directory (new, empty or a previous export), got a file")
    names = sorted(p.name for p in out_dir.iterdir())
    if not names:
        return
    foreign = [n for n in names if n not in EXPORT_FILES and TMP_MARK not in n]
    is_export = (out_dir / WEIGHTS).is_file() and _is_eagle3_config(out_dir / CONFIG)
    if is_export and not foreign:
        return
    what = "a previous export (config.json of speculators_model_type eagle3 + model.safetensors)"
    got = f"foreign files {foreign[:10]}" + (f" (+{len(foreign) - 10} more)" if len(foreign) > 10 else "")
    if not is_export:
        got = f"no export's config.json + model.safetensors; {got if foreign else f'files {names[:10]}'}"
    raise ExportDirError(
        f"out={out_dir}: expected a new or empty directory or {what} holding only {sorted(EXPORT_FILES)}, "
        f"got {got}; the export replaces the directory whole, so nothing was written: pass out=<a new directory> "
        "(or move those files away)"
    )


def _is_eagle3_config(config: Path) -> bool:
    try:
        return json.loads(config.read_text()).get("speculators_model_type") == "eagle3"
    except (OSError, ValueError, AttributeError):  # missing, unreadable, not JSON, not an object
        return False


def save_head(
    head: Eagle3DraftHead, meta: DraftMeta, out_dir: str | Path, before_swap: Callable[[Path], None] | None = None
) -> Path:
    """config.json + model.safetensors (bf16), written to a temp dir then swapped into place
    (``eagle3.util.atomic.atomic_dir``): a killed export leaves the previous one whole. Only
    into a new or empty directory or over a previous export (check_export_dir). ``before_swap``:
    called with the finished temp dir before it replaces ``out_dir`` (the export's owner,
    eagle3/serving/export_dir.py, carries over what the previous export holds beside these files)."""
    out_dir = Path(out_dir)
    check_export_dir(out_dir)
    config = speculators_config_dict(
        meta.draft_config,
        meta.aux_layer_ids,
        meta.target_name_or_path,
        meta.num_speculative_tokens,
        target_architectures=meta.target_architectures,
    )
    weights = export_state_dict(head)
    check_finite(weights, f"{out_dir / 'model.safetensors'}")
    with atomic_dir(out_dir, point="export_write") as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        apply_umask(tmp / "model.safetensors")  # safetensors leaves its files 0600
        (tmp / "eagle3_meta.json").write_text(
            json.dumps(
                {
                    "draft_config": asdict(meta.draft_config),
                    "aux_layer_ids": meta.aux_layer_ids,
                    "serve_tensor_parallel_size": meta.serve_tensor_parallel_size,
                    "serve_trust_remote_code": meta.serve_trust_remote_code,
                    "serve_quantization": meta.serve_quantization,
                    "served_target": meta.served_target,
                },
                indent=2,
            )
        )
        if before_swap is not None:
            before_swap(tmp)
    return out_dir


class ExportError(RuntimeError):
    pass


def read_config(export_dir: str | Path) -> dict[str, Any]:
    """config.json of an export directory that holds both files and is an EAGLE-3 head."""
    export_dir = Path(export_dir).expanduser()
    config_file = export_dir / CONFIG
    if not config_file.is_file():
        raise ExportError(f"export_dir={export_dir}: no config.json (expected train.py's export directory)")
    if not (export_dir / WEIGHTS).is_file():
        raise ExportError(f"export_dir={export_dir}: no {WEIGHTS}")
    cfg = json.loads(config_file.read_text())
    if cfg.get("speculators_model_type") != "eagle3":
        raise ExportError(
            f"{config_file}: speculators_model_type: expected 'eagle3', got {cfg.get('speculators_model_type')!r}"
        )
    return cfg


class LoadedHead(NamedTuple):
    head: Eagle3DraftHead  # in eval mode, fp32
    aux_layer_ids: list[int]  # vLLM numbering, as config.json names them
    norms: dict[str, bool]  # the norm flags as vLLM reads them (config.NORM_OPTIONS)


def load_head(
    export_dir: str | Path, target_config: Mapping[str, Any], target_weights: Mapping[str, torch.Tensor]
) -> LoadedHead:
    """The reverse of save_head: the export as an Eagle3DraftHead. Sizes the export does not
    record (hidden size, target vocabulary, rope) come from the target's HF config
    (``target_config``); its frozen pieces from ``target_weights`` (embed [Vt, H], norm [H],
    lm_head [Vt, H], as eagle3.target_model's load_target_head_weights returns them)."""
    export_dir = Path(export_dir)
    cfg = json.loads((export_dir / CONFIG).read_text())
    layer = cfg["transformer_layer_config"]
    aux_layer_ids = [int(i) for i in cfg["eagle_aux_hidden_state_layer_ids"]]
    # the norm flags as vLLM reads them, its defaults for a key the file lacks
    norms = {name: bool(cfg.get(name, default)) for name, default in VLLM_NORM_DEFAULTS.items()}
    draft_cfg = DraftConfig.from_target_config(
        dict(target_config),
        draft_vocab_size=int(cfg["draft_vocab_size"]),
        num_aux_layers=len(aux_layer_ids),
        **norms,
        num_attention_heads=int(layer["num_attention_heads"]),
        num_key_value_heads=int(layer["num_key_value_heads"]),
        intermediate_size=int(layer["intermediate_size"]),
        num_layers=int(layer.get("num_hidden_layers", 1)),
    )
    head = Eagle3DraftHead(draft_cfg)
    weights = load_file(str(export_dir / WEIGHTS))
    w = target_weights
    head.load_target_weights(
        w["embed"].float(),
        w["norm"].float(),
        w["lm_head"].float(),
        weights["d2t"],
        weights["t2d"],
        init_lm_head_from_target=False,
    )  # d2t [V], t2d [Vt]
    load_export_state_dict(
        head, weights, f"{export_dir}/model.safetensors: does not fit the head built from config.json"
    )
    return LoadedHead(head.eval(), aux_layer_ids, norms)
