"""The EAGLE-3 draft head as plain torch: head + TTT, mask, loss/metrics, serving export.

Imports neither lightning nor hydra, so it works from a notebook or another trainer.
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
