"""train.feature_noise: uniform noise on the aux states, relative to each aux layer's RMS at each
token; training batches only (validation reads the states as captured)."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_head_with_meta
from helpers.trainers import quiet_cpu_trainer

from eagle3.config.training import TrainConfig
from eagle3.draft.feature_noise import add_feature_noise
from eagle3.training.module import Eagle3LitModule


def test_the_noise_is_bounded_by_each_layers_own_scale():
    torch.manual_seed(0)
    # three aux layers whose scales differ 1000-fold, as residual streams of one target do
    states = torch.randn(2, 50, 3, 64) * torch.tensor([0.01, 1.0, 10.0]).view(1, 1, 3, 1)  # [B, T, L, H]
    aux = states.reshape(2, 50, 3 * 64)  # [B, T, L*H]
    noisy = add_feature_noise(aux, 0.1, 3).view(2, 50, 3, 64)
    rms = states.pow(2).mean(-1, keepdim=True).sqrt()  # [B, T, L, 1]
    moved = (noisy - states).abs() / rms  # [B, T, L, H]: each move in units of its own state's RMS
    assert float(moved.max()) <= 0.1 + 1e-5
    # uniform in (-0.1, 0.1): the mean move is half the bound, whatever the layer's scale
    for layer in range(3):
        assert float(moved[:, :, layer].mean()) == pytest.approx(0.05, rel=0.05)
    assert float((noisy - states).mean()) == pytest.approx(0.0, abs=1e-2)


def test_zero_is_the_tensor_itself_and_a_negative_amount_is_refused():
    aux = torch.randn(1, 4, 6, dtype=torch.bfloat16)
    assert add_feature_noise(aux, 0.0, 3) is aux
    assert add_feature_noise(aux, 0.2, 3).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="train.feature_noise: expected >= 0, got -0.1"):
        add_feature_noise(aux, -0.1, 3)
    with pytest.raises(ValueError, match="not num_aux_layers=4 states wide"):
        add_feature_noise(aux, 0.1, 4)


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    t = 12
    return {
        "aux_hidden": torch.randn(1, t, 3 * 32, generator=g),
        "input_ids": torch.randint(0, 97, (1, t), generator=g),
        "position_ids": torch.arange(t).unsqueeze(0),
        "segment_ids": torch.zeros(1, t, dtype=torch.long),
        "final_hidden": torch.randn(1, t, 32, generator=g),
        "loss_mask": torch.ones(1, t, dtype=torch.bool),
    }


def _fit(noise: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The head's fc weight after 2 steps, and the aux states each step's head read."""
    torch.manual_seed(3)
    head, _ = tiny_head_with_meta(seed=1)
    cfg = TrainConfig(ttt_steps=2, feature_noise=noise, lr=1e-2, warmup_steps=0, max_steps=2, max_tokens_per_batch=16)
    module = Eagle3LitModule(head, cfg, replay_draft_tokens=2)
    seen: list[torch.Tensor] = []
    head.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().clone()))
    trainer = quiet_cpu_trainer(
        max_steps=2,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        val_check_interval=2,
    )
    batch = _batch()
    trainer.fit(
        module,
        train_dataloaders=torch.utils.data.DataLoader([batch] * 2, batch_size=None),
        val_dataloaders=torch.utils.data.DataLoader([batch], batch_size=None),
    )
    return module.head.fc.weight.detach(), seen


def test_training_steps_read_noisy_states_and_validation_the_captured_ones():
    clean = _batch()["aux_hidden"]
    w_plain, seen_plain = _fit(0.0)
    w_noisy, seen_noisy = _fit(0.2)
    assert len(seen_plain) == len(seen_noisy) == 3  # two training steps, one validation batch
    assert all(torch.equal(s, clean) for s in seen_plain)
    train_seen, val_seen = seen_noisy[:2], seen_noisy[2]
    for s in train_seen:
        assert not torch.equal(s, clean) and float((s - clean).abs().max()) < 0.2 * float(clean.abs().max())
    assert not torch.equal(train_seen[0], train_seen[1])  # fresh noise each step
    assert torch.equal(val_seen, clean)
    assert not torch.equal(w_noisy, w_plain)  # the noise reached the update


def test_a_negative_amount_is_refused_at_compose_time():
    from conftest import compose

    from eagle3.config.errors import ConfigError
    from eagle3.stages.validate import validate_run_config

    validate_run_config(compose("train", ["experiment=demo_cpu", "train.feature_noise=0.1"]))
    with pytest.raises(ConfigError, match=r"train.feature_noise: expected >= 0 .*got -0.5"):
        validate_run_config(compose("train", ["experiment=demo_cpu", "train.feature_noise=-0.5"]))
