"""train.loss_tokens: which positions the training loss counts; validation always scores answers."""

import pytest
import torch
from helpers import PACKED_ANSWERS, PACKED_SEGMENTS, VT, H, make_head

from eagle3.config.choices import LossTokens
from eagle3.config.training import TrainConfig
from eagle3.training.module import Eagle3LitModule

# step k counts t when x_{t+2+k} lies in t's sample (and, for answers only, is an answer token):
# every token: max(n - 2 - k, 0) per sample of n tokens = [5 + 3, 4 + 2, 3 + 1]
ALL_COUNTS = [8, 6, 4]
# answers only: sample 0 targets 4..6 from t = 2..4 (k=0), 1..3 (k=1), 0..2 (k=2); sample 1
# targets its local 2..4 from t = 0..2, 0..1, 0..0
ANSWER_COUNTS = [3 + 3, 3 + 2, 3 + 1]


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    t = PACKED_SEGMENTS.shape[1]
    position_ids = torch.cat([torch.arange(7), torch.arange(5)]).unsqueeze(0)
    return {
        "aux_hidden": torch.randn(1, t, 3 * H, generator=g),
        "input_ids": torch.randint(0, VT, (1, t), generator=g),
        "position_ids": position_ids,
        "segment_ids": PACKED_SEGMENTS,
        "final_hidden": torch.randn(1, t, H, generator=g),
        "loss_mask": PACKED_ANSWERS,
    }


@pytest.mark.parametrize("loss_tokens,expected", [(LossTokens.assistant, ANSWER_COUNTS), (LossTokens.all, ALL_COUNTS)])
def test_the_training_loss_counts_the_chosen_positions_and_validation_the_answers(loss_tokens, expected):
    module = Eagle3LitModule(make_head(), TrainConfig(ttt_steps=3, loss_tokens=loss_tokens), replay_draft_tokens=0)
    batch = _batch()
    loss, counts = module._forward_loss(batch)
    assert counts.loss_count.tolist() == expected
    loss.backward()  # the prompt positions reach the gradient as well
    assert module.head.fc.weight.grad is not None and module.head.fc.weight.grad.abs().sum() > 0

    module.on_validation_epoch_start()
    with torch.no_grad():
        module.validation_step(batch, 0)
    assert module._val_counts.loss_count.tolist() == ANSWER_COUNTS


def test_prompt_positions_change_the_training_loss():
    batch = _batch()
    losses = {}
    for loss_tokens in LossTokens:
        module = Eagle3LitModule(make_head(), TrainConfig(ttt_steps=3, loss_tokens=loss_tokens), replay_draft_tokens=0)
        with torch.no_grad():
            losses[loss_tokens] = module._forward_loss(batch)[0].item()
    assert losses[LossTokens.all] != pytest.approx(losses[LossTokens.assistant], rel=1e-4)
