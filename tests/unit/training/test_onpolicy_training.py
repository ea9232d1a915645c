"""train.onpolicy_weight in the Lightning module: 0 is the supervised loss bit for bit; above 0 the
step mixes in the on-policy objective and logs it with the current head's rounds under train/*."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_head_with_meta
from helpers.trainers import quiet_cpu_trainer

from eagle3.config.training import TrainConfig
from eagle3.draft.loss import eagle3_loss
from eagle3.training.module import Eagle3LitModule

SEGMENTS = torch.tensor([[0] * 9 + [1] * 7])
ANSWERS = torch.tensor([[False] * 3 + [True] * 6 + [False] * 2 + [True] * 5])


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    t = SEGMENTS.shape[1]
    return {
        "aux_hidden": torch.randn(1, t, 3 * 32, generator=g),
        "input_ids": torch.randint(0, 97, (1, t), generator=g),
        "position_ids": torch.cat([torch.arange(9), torch.arange(7)]).unsqueeze(0),
        "segment_ids": SEGMENTS,
        "final_hidden": torch.randn(1, t, 32, generator=g),
        "loss_mask": ANSWERS,
    }


def _module(weight: float) -> Eagle3LitModule:
    head, _ = tiny_head_with_meta(seed=1)
    cfg = TrainConfig(
        ttt_steps=3, onpolicy_weight=weight, lr=1e-3, warmup_steps=0, max_steps=3, max_tokens_per_batch=16
    )
    return Eagle3LitModule(head, cfg, replay_draft_tokens=3)


def test_weight_zero_trains_on_the_supervised_loss_bit_for_bit():
    module, batch = _module(0.0), _batch()
    loss, counts = module._forward_loss(batch)
    mixed, supervised, mixed_counts, _ = module._forward_mixed(batch)
    assert torch.equal(mixed, loss) and torch.equal(supervised, loss.detach())
    assert torch.equal(mixed_counts.stacked(), counts.stacked())
    step_logits, target_logits, covered = module._logits(batch)
    direct, _ = eagle3_loss(
        step_logits, target_logits, loss_mask=SEGMENTS >= 0, segment_ids=SEGMENTS, step_decay=0.8, covered=covered
    )
    assert torch.equal(loss, direct)  # the training loss before the on-policy objective existed


def test_a_weight_mixes_the_objective_in_linearly():
    module, batch = _module(0.3), _batch()
    mixed, supervised, _, onpolicy = module._forward_mixed(batch)
    assert float(mixed.detach()) == pytest.approx(0.7 * float(supervised) + 0.3 * float(onpolicy.loss.detach()))
    assert float(onpolicy.counts[0]) > 0  # both answers were walked into rounds


def test_a_fit_logs_the_objective_and_the_rounds_under_train():
    module = _module(0.5)
    data = torch.utils.data.DataLoader([_batch()] * 3, batch_size=None)
    trainer = quiet_cpu_trainer(max_steps=3, limit_val_batches=0)
    before = module.head.fc.weight.detach().clone()
    trainer.fit(module, train_dataloaders=data)
    logged = trainer.callback_metrics
    for key in ("train/onpolicy_loss", "train/supervised_loss", "train/onpolicy_accept_len", "train/onpolicy_acc_pos2"):
        assert key in logged, sorted(logged)
    assert 1.0 <= float(logged["train/onpolicy_accept_len"]) <= 4.0
    mixed = 0.5 * float(logged["train/supervised_loss"]) + 0.5 * float(logged["train/onpolicy_loss"])
    assert float(logged["train/loss"]) == pytest.approx(mixed, rel=1e-5)
    assert not torch.equal(module.head.fc.weight, before)
    assert "train/compiled_graphs" not in logged  # eager: no compile counter on the dashboard


def test_train_compile_compiles_the_mixed_step_too(monkeypatch):
    """train.compile=true: setup compiles the on-policy step like the supervised one (its walk is
    tensors, replay.round_starts), and a fit trains through it; aot_eager and fullgraph here keep
    the test fast and make a graph break an error."""
    compiled_fns = []

    def compile_fullgraph(fn, **kwargs):
        compiled_fns.append(fn.__name__)
        return real_compile(fn, **kwargs, fullgraph=True, backend="aot_eager")

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", compile_fullgraph)
    module = _module(0.5)
    module.train_cfg.compile = True
    data = torch.utils.data.DataLoader([_batch()] * 2, batch_size=None)
    trainer = quiet_cpu_trainer(max_steps=2, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=data)
    assert "_forward_mixed" in compiled_fns and module._mixed_step != module._forward_mixed
    assert "train/compiled_graphs" in trainer.callback_metrics


def test_the_compiled_mixed_step_gives_the_eager_loss_and_gradients():
    """The mixed step under inductor, one graph (fullgraph: a break raises), as setup compiles it
    (dynamic=False): the eager loss, its parts, the rounds' counts and the gradients."""
    module, batch = _module(0.3), _batch()
    eager, eager_supervised, _, eager_onpolicy = module._forward_mixed(batch)
    eager_grad = torch.autograd.grad(eager, module.head.fc.weight)[0]
    compiled_step = torch.compile(module._forward_mixed, dynamic=False, fullgraph=True)
    compiled, compiled_supervised, _, compiled_onpolicy = compiled_step(batch)
    compiled_grad = torch.autograd.grad(compiled, module.head.fc.weight)[0]
    assert float(compiled_onpolicy.counts[0]) > 0
    assert compiled_onpolicy.counts.equal(eager_onpolicy.counts)
    assert float(compiled.detach()) == pytest.approx(float(eager.detach()), rel=1e-5)
    assert float(compiled_supervised) == pytest.approx(float(eager_supervised), rel=1e-5)
    assert compiled_onpolicy.metrics() == pytest.approx(eager_onpolicy.metrics(), rel=1e-5)
    assert torch.allclose(compiled_grad, eager_grad, rtol=1e-4, atol=1e-6)
