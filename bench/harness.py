"""What the benches share: the checkout on sys.path, the targets' shapes read from conf/model/
(each written once, in its preset: conf/model/llama3_1_8b.yaml holds Llama-3.1-8B's), and the
argument and result handling every bench repeats.

    from harness import ROOT, target_config, write_json   # bench/ is sys.path[0] for a bench

A bench imports eagle3's public names only (tests/unit/stages/test_layering.py); eagle3 never imports bench/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
CONF = ROOT / "conf"
for _p in (str(BENCH), str(ROOT)):  # `python bench/<name>.py` from anywhere, no install needed
    if _p not in sys.path:
        sys.path.insert(0, _p)

# the transformers model_type of each architecture a preset names
MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}


def model_conf(name: str) -> Any:
    """conf/model/<name>.yaml over eagle3's ModelConfig schema (what `model=<name>` composes to)."""
    from omegaconf import OmegaConf

    from eagle3.config.target import ModelConfig

    raw = OmegaConf.load(CONF / "model" / f"{name}.yaml")
    raw.pop("defaults", None)
    return OmegaConf.merge(OmegaConf.structured(ModelConfig), raw)


def target_config(name: str) -> dict[str, Any]:
    """The target's config.json fields from its preset: the shapes, then its extra_config."""
    m = model_conf(name)
    config: dict[str, Any] = {
        "model_type": MODEL_TYPES.get(m.architecture, ""),
        "architectures": [m.architecture],
        "num_hidden_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.num_key_value_heads,
        "intermediate_size": m.intermediate_size,
        "vocab_size": m.vocab_size,
    }
    from omegaconf import OmegaConf

    config.update(OmegaConf.to_container(m.extra_config) if m.extra_config else {})
    return config


def ints(text: str) -> list[int]:
    """A comma-separated list of integers (--loads 1,8,32)."""
    return [int(x) for x in text.split(",") if x.strip()]


def add_out(ap: argparse.ArgumentParser, required: bool = True, help: str = "JSON results path") -> None:
    ap.add_argument("--out", required=required, default=None, help=help)


def write_json(path: str | Path | None, doc: Any, indent: int = 2, echo: bool = False) -> Path | None:
    """The bench's result as JSON at ``path`` (None: not written); ``echo``: printed too."""
    text = json.dumps(doc, indent=indent)
    if echo:
        print(text)
    if path is None:
        return None
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out
