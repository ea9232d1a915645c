"""polish.py continues training a head that exists: each round's config takes the head's
architecture (draft vocabulary, layers, MLP width, norm flags, aux layer ids) from the start
export's config.json, over the head group and the command line, and the round's train config then
fits that export; a size the target fixes (hidden_size) is still refused by check_compatible."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import compose
from omegaconf import OmegaConf

from eagle3.config.polish import PolishConfig
from eagle3.config.schema import run_config
from eagle3.draft import DraftConfig, Eagle3DraftHead
from eagle3.draft.serving_format import DraftMeta, save_head
from eagle3.stages.compose import register_polish_config
from eagle3.stages.polish import _architecture_line, round_config, start_architecture
from eagle3.target_model.resolve import tiny_config
from eagle3.training.builder import draft_config
from eagle3.training.init_from import InitFromError, check_compatible, read_init_head

# tiny_llama with 8 layers (the EAGLE-3 default aux ids [2, 4, 5]); nothing is materialised
TARGET = ["model=tiny_llama", "model.num_layers=8"]
# the start head: all of these differ from head=eagle3's (32,000-token vocabulary capped at the
# target's, one layer, the target's MLP width 128, the EAGLE-3.1 norms) and the default aux ids
HEAD = dict(
    draft_vocab_size=1000,
    num_layers=2,
    intermediate_size=192,
    norm_before_fc=False,
    fc_norm=True,
    norm_output=False,
    norm_before_residual=False,
)
AUX = [1, 3, 6]


def _export(out: Path, hf: dict, aux: list[int] = AUX) -> Path:
    """A random head for the target ``hf`` (its config.json) with HEAD's choices, exported."""
    cfg = DraftConfig.from_target_config(hf, num_aux_layers=len(aux), **HEAD)
    torch.manual_seed(0)
    head = Eagle3DraftHead(cfg)
    vt, v = cfg.target_vocab_size, cfg.draft_vocab_size
    t2d = torch.zeros(vt, dtype=torch.bool)
    t2d[torch.randperm(vt)[:v]] = True
    d2t = t2d.nonzero().squeeze(1) - torch.arange(v)
    h = cfg.hidden_size
    head.load_target_weights(torch.randn(vt, h), torch.ones(h), torch.randn(vt, h), d2t, t2d, True)
    return save_head(head, DraftMeta(cfg, aux, "tiny", ["LlamaForCausalLM"], 3), out)


def _polish(tmp_path: Path, export: Path, *more: str):
    register_polish_config()
    return compose(
        "polish",
        [*TARGET, f"train.init_from={export}", "logger=none", *more],
        output_dir=str(tmp_path / "polish"),
    )


@pytest.fixture(scope="module")
def hf() -> dict:
    """tiny_llama's config.json as the target's (8 layers, hidden 64, MLP 128, vocabulary 49,152)."""
    register_polish_config()
    return tiny_config(run_config(compose("train", TARGET)).model).to_dict()


def test_each_round_takes_the_start_heads_architecture_and_fits_it(tmp_path, hf):
    export = _export(tmp_path / "start", hf)
    # the head group's defaults, and a command-line MLP width, that the head contradicts
    composed = _polish(tmp_path, export, "head=eagle3", "head.intermediate_size=96")
    init = read_init_head(str(export))
    as_composed = OmegaConf.to_object(composed.head)
    with pytest.raises(InitFromError, match=r"intermediate_size: expected 96 \(head.intermediate_size\), got 192"):
        check_compatible(init, draft_config(as_composed, hf, 3), list(composed.layers.aux_layer_ids))

    polish = PolishConfig(rounds=2, prompts_per_round=4, steps_per_round=1)
    for number, head in ((1, str(export)), (2, str(tmp_path / "round-1" / "export"))):
        run = run_config(round_config(composed, polish, number, head, tmp_path / "polish"))
        assert run.train.init_from == head
        assert (run.head.draft_vocab_size, run.head.num_draft_layers, run.head.intermediate_size) == (1000, 2, 192)
        assert (run.head.norm_before_fc, run.head.fc_norm, run.head.norm_output, run.head.norm_before_residual) == (
            False,
            True,
            False,
            False,
        )
        assert (run.head.num_attention_heads, run.head.num_key_value_heads) == (4, 2)  # the head's (the target's)
        assert list(run.layers.aux_layer_ids) == AUX and list(run.layers.layer_ids) == [*AUX, 8]
        # what train.py builds from the round's config is the head the export holds
        check_compatible(init, draft_config(run.head, hf, len(AUX)), list(run.layers.aux_layer_ids))

    line = _architecture_line(composed, {"head.draft_vocab_size": 1000, "head.intermediate_size": 192})
    assert line.startswith(f"polish: from the start head's config.json (train.init_from={export}): ")
    assert "head.draft_vocab_size=1000 (this config: 32000)" in line
    assert "head.intermediate_size=192 (this config: 96)" in line


def test_the_line_names_only_where_the_head_overrides_this_config(tmp_path, hf):
    export = _export(tmp_path / "start", hf)
    composed = _polish(tmp_path, export, "head=eagle3")
    architecture = start_architecture(composed)
    assert architecture["layers.aux_ids"] == AUX and architecture["layers.numbering"] == "vllm"
    line = _architecture_line(composed, architecture)
    # head=eagle3 leaves the MLP width and the attention sizes to the target (128, 4, 2)
    assert "head.intermediate_size=192 (this config: 128)" in line
    assert "head.num_attention_heads=4," in line and "head.num_key_value_heads=2," in line
    assert "layers.aux_ids=[1,3,6] (this config: [2,4,5])" in line
    assert "head.fc_norm=true (this config: false)" in line and "numbering" not in line
    # a config that already is the head's: every value named, none overridden
    same = _polish(
        tmp_path,
        export,
        "head.draft_vocab_size=1000",
        "head.num_draft_layers=2",
        "head.intermediate_size=192",
        "head.norm_before_fc=false",
        "head.fc_norm=true",
        "head.norm_output=false",
        "head.norm_before_residual=false",
        "layers.aux_ids=[1,3,6]",
    )
    assert "this config" not in _architecture_line(same, architecture)


def test_a_size_the_target_fixes_is_still_refused_naming_the_field(tmp_path, hf):
    # a head for a target twice as wide: nothing polish.py may override makes it fit tiny_llama
    export = _export(tmp_path / "wide", dict(hf, hidden_size=128, head_dim=32))
    composed = _polish(tmp_path, export)
    run = run_config(round_config(composed, PolishConfig(), 1, str(export), tmp_path / "polish"))
    assert run.head.intermediate_size == 192 and list(run.layers.aux_layer_ids) == AUX
    with pytest.raises(InitFromError, match=r"hidden_size: expected 64 \(the target's hidden_size\), got 128") as e:
        check_compatible(read_init_head(str(export)), draft_config(run.head, hf, len(AUX)), AUX)
    assert "intermediate_size" not in str(e.value) and "draft_vocab_size" not in str(e.value)
