"""DraftConfig: the architecture of one EAGLE-3 draft head, derived from the target's config.

The draft's decoder layer is Llama-shaped whatever the target is (speculators and vLLM's
`llama_eagle3` build it that way); its sizes default to the target's so the aux features,
embeddings and lm_head rows can be shared without projection.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

# Targets whose own config describes a Llama-like attention block we can copy.
_LLAMA_LIKE = {"llama", "qwen2", "qwen3", "mistral"}
# Rope types our rotary implementation computes (see rope.py).
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# The EAGLE-3(.1) norm options, spelled as speculators 0.9 and vLLM 0.32 spell them: each is a
# DraftConfig field, a `train.<name>` key and a config.json key of the export. vLLM 0.32's
# llama_eagle3 implements all four (the weight names are the module names in head.py).
NORM_OPTIONS = ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual")
# what vLLM 0.32 assumes for a key config.json lacks (its configs/speculators/algos.py): our
# export writes every key; a reader of someone else's export takes these, as serving would
VLLM_NORM_DEFAULTS = {"norm_before_fc": False, "fc_norm": False, "norm_output": False, "norm_before_residual": True}


class DraftConfigError(ValueError):
    pass


def check_norm_options(options: Mapping[str, Any], where: str = "DraftConfig") -> None:
    """Refuse a combination of norm options (NORM_OPTIONS -> bool) that a peer cannot load.

    norm_before_fc (one RMSNorm over the concatenated aux states) and fc_norm (one per aux
    state) are exclusive in speculators 0.9 (its config validator raises); vLLM 0.32 would
    apply both one after the other, so such an export would load in vLLM but not in speculators.
    """
    if options.get("norm_before_fc") and options.get("fc_norm"):
        raise DraftConfigError(
            f"{where}: norm_before_fc and fc_norm are mutually exclusive (speculators 0.9 refuses the pair; "
            "vLLM 0.32 would apply both norms): enable one of them"
        )


@dataclass
class DraftConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    target_vocab_size: int
    draft_vocab_size: int
    rope_theta: float
    max_position_embeddings: int
    num_aux_layers: int = 3
    rms_norm_eps: float = 1e-6  # use the target's
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    # The norm options (NORM_OPTIONS); weight names as speculators and vLLM load them.
    # norm_before_fc: `input_norm`, one RMSNorm over the concatenated aux features before fc.
    norm_before_fc: bool = False
    # fc_norm: `fc_norm.{i}`, an RMSNorm per aux feature (H each) before fc; exclusive with
    # norm_before_fc.
    fc_norm: bool = False
    # norm_output: TTT step k+1 (and vLLM's next draft position) reads norm(h_k), the very
    # state the lm_head reads, instead of the pre-norm h_k (no weight of its own: `norm`).
    norm_output: bool = False
    # norm_before_residual: the residual of the first layer is hidden_norm(hidden) instead of
    # hidden. speculators trains False; vLLM assumes True when the key is missing, so the
    # export always writes it.
    norm_before_residual: bool = False
    hidden_act: str = "silu"
    # rope scaling beyond rope_theta, e.g. Llama 3.1's {"rope_type": "llama3", "factor": 8.0,
    # "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    rope_scaling: dict[str, Any] | None = None
    initializer_range: float = 0.02
    # decoder layers: the first takes concat(embeddings, hidden) (2H); each further one is a
    # plain Llama layer over the hidden stream (speculators and vLLM llama_eagle3 build them so)
    num_layers: int = 1

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise DraftConfigError(f"DraftConfig: num_layers must be >= 1, got {self.num_layers}")
        check_norm_options(self.norm_options)
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise DraftConfigError(
                    f"DraftConfig: hidden_size {self.hidden_size} is not divisible by "
                    f"num_attention_heads {self.num_attention_heads}; set head_dim explicitly"
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise DraftConfigError(
                f"DraftConfig: num_attention_heads {self.num_attention_heads} must be a multiple "
                f"of num_key_value_heads {self.num_key_value_heads}"
            )
        if not 0 < self.draft_vocab_size <= self.target_vocab_size:
            raise DraftConfigError(
                f"DraftConfig: draft_vocab_size must be in 1..target_vocab_size "
                f"({self.target_vocab_size}), got {self.draft_vocab_size}"
            )
        if self.hidden_act != "silu":
            raise DraftConfigError(f"DraftConfig: hidden_act: only 'silu' is implemented, got {self.hidden_act!r}")
        rope_type = self.rope_type
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise DraftConfigError(
                f"DraftConfig: rope_scaling.rope_type {rope_type!r} is not implemented; "
                f"expected one of {SUPPORTED_ROPE_TYPES} (override rope_scaling=None for plain rope)"
            )

    @property
    def rope_type(self) -> str:
        if not self.rope_scaling:
            return "default"
        return str(self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default")))

    @property
    def rope_parameters(self) -> dict[str, Any]:
        """transformers-5 style rope description (what config.json's transformer_layer_config holds)."""
        params: dict[str, Any] = {"rope_theta": float(self.rope_theta), "rope_type": "default"}
        if self.rope_scaling:
            params.update({k: v for k, v in self.rope_scaling.items() if k != "type"})
            params["rope_type"] = self.rope_type
        return params

    @property
    def norm_options(self) -> dict[str, bool]:
        return {name: bool(getattr(self, name)) for name in NORM_OPTIONS}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DraftConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise DraftConfigError(
                f"DraftConfig.from_dict: unknown fields {unknown}; expected a subset of {sorted(names)}"
            )
        return cls(**d)

    @classmethod
    def from_target_config(
        cls,
        hf_config_dict: dict[str, Any],
        draft_vocab_size: int,
        num_aux_layers: int = 3,
        **overrides: Any,
    ) -> DraftConfig:
        """Sizes from the target's HF config.json dict; `overrides` (non-None values) win.

        Llama-like targets (llama, qwen2/3, mistral) give heads, kv heads, head_dim,
        intermediate size and rope directly. Other architectures (DeepSeek-V3 / Kimi: MLA
        attention, MoE) have no Llama attention block to copy: the draft then uses
        head_dim = hidden // heads, plain rope with the target's theta, and the dense
        intermediate_size; override any of them explicitly.
        """
        cfg: dict[str, Any] = dict(hf_config_dict.get("text_config") or hf_config_dict)
        model_type = str(cfg.get("model_type", ""))

        def need(key: str) -> Any:
            if key not in cfg or cfg[key] is None:
                raise DraftConfigError(
                    f"DraftConfig.from_target_config: target config (model_type={model_type!r}) "
                    f"has no {key!r}; pass it as an override"
                )
            return cfg[key]

        rope_params = cfg.get("rope_parameters") or {}
        rope_theta = rope_params.get("rope_theta", cfg.get("rope_theta", 10000.0))
        llama_like = model_type in _LLAMA_LIKE
        rope_scaling: dict[str, Any] | None = None
        if llama_like:
            scaling = dict(rope_params) if rope_params else dict(cfg.get("rope_scaling") or {})
            scaling.pop("rope_theta", None)
            if scaling and str(scaling.get("rope_type", scaling.get("type", "default"))) != "default":
                rope_scaling = scaling
        num_heads = int(need("num_attention_heads"))
        values: dict[str, Any] = dict(
            hidden_size=int(need("hidden_size")),
            num_attention_heads=num_heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or num_heads),
            intermediate_size=int(need("intermediate_size")),
            target_vocab_size=int(need("vocab_size")),
            draft_vocab_size=int(draft_vocab_size),
            num_aux_layers=int(num_aux_layers),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            head_dim=int(cfg["head_dim"]) if llama_like and cfg.get("head_dim") else None,
            hidden_act=str(cfg.get("hidden_act", "silu")),
            rope_scaling=rope_scaling,
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
