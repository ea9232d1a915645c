"""A target and a head as config files only, at a recipe's real shapes: what vLLM needs to serve
them with dummy weights (bench/serving_speedup.py --load-format dummy). The step costs of a
target class, c(K, load), depend on its shapes alone, so they can be measured on a machine that
holds neither the target's weights nor room for them (Qwen3-30B-A3B's 61 GB, Kimi-K2.5's 1T
parameters cut to what one GPU holds); acceptance and outputs then mean nothing.

    python lab/leased_gpu/shapes_only.py OUT experiment=qwen3_30b_a3b model.tokenizer_from=DIR \
        [model.num_layers=... model.extra_config.n_routed_experts=...]

writes OUT/target (config.json from the preset, as model.source=tiny builds it, and the
tokenizer of model.tokenizer_from: SmolLM2's ids fit every vocabulary) and OUT/head (the
export's config.json for the recipe's head and layer ids), then prints their sizes. Both are a
few MiB: they travel to the GPU machine in one call, where

    python bench/serving_speedup.py --load-format dummy --target OUT/target --export-dir OUT/head \
        --prompts-jsonl chats.jsonl --loads 1,8,32,64 --draft-tokens 1,2,3,5 --out costs.json

prints the step costs in the form of eagle3/serving/step_costs.yaml.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from eagle3.config.target import ModelConfig
from eagle3.config.training import TrainConfig
from eagle3.draft.serving_format import speculators_config_dict
from eagle3.stages.compose import register_configs
from eagle3.target_model.resolve import tiny_config, tokenizer_source
from eagle3.target_model.size import target_size
from eagle3.training.builder import draft_config

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its conf/


def write_shapes(out: Path, overrides: list[str]) -> tuple[Path, Path]:
    """OUT/target and OUT/head for the train config these overrides compose."""
    from transformers import AutoTokenizer

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, "model.source=tiny", f"paths.output_dir={out}/compose"])
    model: ModelConfig = OmegaConf.to_object(cfg.model)
    train: TrainConfig = OmegaConf.to_object(cfg.train)
    if not model.tokenizer_from:
        raise SystemExit("model.tokenizer_from=DIR: a tokenizer to serve with (SmolLM2's fits every vocabulary)")
    aux_layer_ids = [int(i) for i in cfg.layers.aux_layer_ids]

    target, head = out / "target", out / "head"
    target.mkdir(parents=True, exist_ok=True)
    head.mkdir(parents=True, exist_ok=True)
    AutoTokenizer.from_pretrained(tokenizer_source(model.tokenizer_from, cfg.paths.cache_dir)).save_pretrained(target)
    hf = tiny_config(model)
    hf.save_pretrained(target)  # after the tokenizer: its folder may hold a config.json of its own
    hf_dict = json.loads((target / "config.json").read_text())
    draft = draft_config(cfg.head, hf_dict, len(aux_layer_ids))
    config = speculators_config_dict(
        draft, aux_layer_ids, model.hub_id or model.name, train.ttt_steps, target_architectures=[model.architecture]
    )
    (head / "config.json").write_text(json.dumps(config, indent=2))
    size = target_size(hf_dict)
    print(f"target {target}: {size.describe()}, {model.num_layers} layers, hidden {model.hidden_size}")
    print(f"head {head}: aux layer ids {aux_layer_ids}, draft vocab {draft.draft_vocab_size}")
    return target, head


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-") or "=" in sys.argv[1]:
        sys.exit(__doc__)
    write_shapes(Path(sys.argv[1]).resolve(), sys.argv[2:])


if __name__ == "__main__":
    main()
