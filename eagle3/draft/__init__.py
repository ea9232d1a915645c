"""The EAGLE-3 draft head as plain torch: head + TTT, mask, loss/metrics, serving export.

Imports neither lightning nor hydra, so it works from a notebook or another trainer.

head.py, layers.py, rope.py   the head and its training-time test (TTT) steps
mask.py, flex.py, shift.py    TTT attention masks (dense, block-sparse) and the step shifts
loss.py, teacher.py           per-step loss and counts against the target's (or top-k) distribution
replay.py                     serving's drafting rounds replayed on answers (the figure vLLM matches)
onpolicy.py                   the on-policy objective over the head's own rounds (train.onpolicy_weight)
config.py, serving_format.py, export_files.py   the head's config and the speculators export
"""

from eagle3.draft.config import DraftConfig, DraftConfigError
from eagle3.draft.head import Eagle3DraftHead, TargetWeightsError
from eagle3.draft.loss import StepCounts, eagle3_loss, sim_accept_len
from eagle3.draft.mask import build_ttt_mask, ttt_step_mask
from eagle3.draft.serving_format import export_state_dict, speculators_config_dict

__all__ = [
    "DraftConfig",
    "DraftConfigError",
    "Eagle3DraftHead",
    "StepCounts",
    "TargetWeightsError",
    "build_ttt_mask",
    "eagle3_loss",
    "export_state_dict",
    "sim_accept_len",
    "speculators_config_dict",
    "ttt_step_mask",
]
