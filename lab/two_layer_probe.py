"""A trained one-layer export + a random second layer (o_proj, down_proj scaled up so it
matters), exported again: `python evaluate.py` on it compares vLLM's counters with our
served replay of the same two-layer head, i.e. whether vLLM runs layer 2 as we do.
    python lab/two_layer_probe.py SRC_EXPORT VERIFIER_DIR OUT_EXPORT SCALE   (docs/records/2026-12-01-train-side-estimates.md: SCALE 10)
"""

import dataclasses
import sys

import torch

from eagle3.draft.head import Eagle3DraftHead
from eagle3.draft.serving_format import DraftMeta, save_head
from eagle3.evaluation.diagnostics.head_replay import load_exported_head
from eagle3.target_model.resolve import read_hf_config

src, target, out, scale = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
one, aux = load_exported_head(src, target)
cfg = dataclasses.replace(one.cfg, num_layers=2)
torch.manual_seed(0)
two = Eagle3DraftHead(cfg)
missing, unexpected = two.load_state_dict(one.state_dict(), strict=False)
assert not unexpected and all(m.startswith("layers.1.") for m in missing), (missing, unexpected)
with torch.no_grad():
    two.layers[1].self_attn.o_proj.weight.mul_(scale)
    two.layers[1].mlp.down_proj.weight.mul_(scale)
hf = read_hf_config(target)
meta = DraftMeta(cfg, aux, target, list(hf["architectures"]), 3)
print(save_head(two.eval(), meta, out))
