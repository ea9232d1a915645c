"""The teacher from the stored top-k (eagle3/draft/teacher.py) against the teacher from the final
state: the same loss and metrics when k covers the vocab, the renormalisation over top-k ∩ draft
vocab, rows with no draft token, and training on top-k batches with Lightning."""

import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import PACKED_ANSWERS, PACKED_SEGMENTS, VT, H, V, make_head
from helpers.trainers import quiet_cpu_trainer

from eagle3.config.choices import LossKind
from eagle3.config.training import TrainConfig
from eagle3.draft.loss import LOSS_KINDS, eagle3_loss
from eagle3.draft.replay import replay_counts
from eagle3.draft.teacher import ABSENT_LOGIT, TeacherBatchError, topk_target_logits
from eagle3.evaluation.diagnostics.head_replay import add_batch
from eagle3.training.module import Eagle3LitModule


def _head_and_full_lm(seed: int = 0):
    """A tiny head whose target lm_head [VT, H] is known in full (the top-k needs every row)."""
    head = make_head(seed)
    g = torch.Generator().manual_seed(100 + seed)
    full = torch.randn(VT, H, generator=g) * 0.6  # [VT, H]: peaked enough that top-k matters
    head.load_target_weights(
        head.embed_tokens.weight.clone(),
        head.target_norm.weight.clone(),
        full,
        head.d2t.clone(),
        head.t2d.clone(),
        False,
    )
    return head, full


def _final_batch(seed: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = PACKED_SEGMENTS.shape[1]
    return {
        "aux_hidden": torch.randn(1, t, 3 * H, generator=g),  # [1, T, 3H]
        "input_ids": torch.randint(0, VT, (1, t), generator=g),  # [1, T]
        "position_ids": torch.cat([torch.arange(7), torch.arange(5)]).unsqueeze(0),  # [1, T]
        "segment_ids": PACKED_SEGMENTS,
        "final_hidden": torch.randn(1, t, H, generator=g),  # [1, T, H]
        "loss_mask": PACKED_ANSWERS,
    }


def _topk_batch(head, full: torch.Tensor, batch: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """`batch` with final_hidden replaced by the target's top-k, as the store hands it over."""
    with torch.no_grad():
        logprobs = F.log_softmax(F.linear(head.target_norm(batch["final_hidden"]), full), -1)  # [1, T, VT] fp32
    top = logprobs.topk(k, dim=-1)  # [1, T, k], decreasing
    out = {key: value for key, value in batch.items() if key != "final_hidden"}
    out["teacher_ids"], out["teacher_logprobs"] = top.indices, top.values
    return out


@pytest.mark.parametrize("kind", LOSS_KINDS)
def test_topk_of_the_whole_vocab_gives_the_final_states_loss_and_metrics(kind):
    head, full = _head_and_full_lm()
    final = _final_batch()
    topk = _topk_batch(head, full, final, VT)
    module = Eagle3LitModule(head, TrainConfig(ttt_steps=3, loss=LossKind(kind)), replay_draft_tokens=3)
    with torch.no_grad():
        loss_f, counts_f = module._forward_loss(final)
        loss_k, counts_k = module._forward_loss(topk)
    assert loss_f.item() == pytest.approx(loss_k.item(), rel=1e-4, abs=1e-5)
    for name in ("loss_count", "acc_count", "correct_full", "cond_count"):
        assert torch.equal(getattr(counts_f, name), getattr(counts_k, name)), name
    torch.testing.assert_close(counts_f.loss_sum, counts_k.loss_sum, rtol=1e-4, atol=1e-5)

    replays = []
    for batch in (final, topk):  # validation: the answers' counts and the replayed rounds
        module.on_validation_epoch_start()
        with torch.no_grad():
            module.validation_step(batch, 0)
        replays.append((module._val_counts.stacked(), module._val_replay.clone()))
    torch.testing.assert_close(replays[0][0], replays[1][0], rtol=1e-4, atol=1e-5)
    assert torch.equal(replays[0][1], replays[1][1]) and replays[0][1][0] > 0


def test_small_k_renormalises_over_topk_and_draft_vocab():
    head, _ = _head_and_full_lm()
    in_draft = head.t2d.nonzero().squeeze(1)  # [V] target ids in the draft vocab
    outside = (~head.t2d).nonzero().squeeze(1)
    a, b, c = int(in_draft[3]), int(outside[0]), int(in_draft[10])
    ids = torch.tensor([[[a, b, c]]])  # [1, 1, 3]: decreasing probability, the middle one not in the draft vocab
    lps = torch.tensor([[[-0.5, -1.5, -2.5]]])
    logits, covered = head.teacher_logits({"teacher_ids": ids, "teacher_logprobs": lps})
    assert logits.shape == (1, 1, V) and logits.dtype == torch.float32 and bool(covered.all())
    p = logits.softmax(-1)[0, 0]  # [V]
    # by hand: exp(-0.5) and exp(-2.5) over their sum, on the draft ids of a and c; 0 elsewhere
    da, dc = int(head.target_to_draft[a]), int(head.target_to_draft[c])
    assert (da, dc) == (3, 10)  # draft ids are the target ids' ranks in the draft vocab
    want = torch.zeros(V)
    want[da], want[dc] = 1 / (1 + math.exp(-2.0)), math.exp(-2.0) / (1 + math.exp(-2.0))
    torch.testing.assert_close(p, want, rtol=1e-6, atol=0.0)  # exactly 0 outside: the floor underflows
    assert logits[0, 0, da] == -0.5 and logits[0, 0, dc] == -2.5
    assert torch.isfinite(logits).all() and logits.min() == ABSENT_LOGIT


def test_a_row_with_no_draft_token_leaves_the_loss_and_counts_as_a_miss():
    head, full = _head_and_full_lm()
    final = _final_batch()
    topk = _topk_batch(head, full, final, 4)
    r = 5  # an answer position: row 5 is the teacher of x_6
    outside = (~head.t2d).nonzero().squeeze(1)[:4]
    topk["teacher_ids"][0, r] = outside
    topk["teacher_logprobs"][0, r] = torch.tensor([-0.1, -3.0, -4.0, -5.0])
    # padding-like rows (ids 0, logprobs 0) and a -inf logprob stay finite
    topk["teacher_logprobs"][0, 2, -1] = -math.inf
    logits, covered = head.teacher_logits(topk)
    assert torch.isfinite(logits).all() and not bool(covered[0, r]) and int((~covered).sum()) == 1
    assert torch.equal(logits[0, r], torch.full((V,), ABSENT_LOGIT))  # a uniform row, never read by the loss

    steps = head(topk["aux_hidden"], topk["input_ids"], topk["position_ids"], topk["segment_ids"], 3)
    kw = dict(loss_mask=PACKED_ANSWERS, segment_ids=PACKED_SEGMENTS, step_decay=0.8)
    loss, counts = eagle3_loss(steps, logits, covered=covered, **kw)
    # the loss equals the one with the token row r predicts taken out of the answers
    fewer = PACKED_ANSWERS.clone()
    fewer[0, r + 1] = False
    loss_without, counts_without = eagle3_loss(steps, logits, **kw | {"loss_mask": fewer})
    assert torch.isfinite(loss) and loss.item() == pytest.approx(loss_without.item(), rel=1e-6)
    assert torch.equal(counts.loss_count, counts_without.loss_count)
    # accuracy still scores the position (as a miss): the same positions as with every row usable
    _, counts_all = eagle3_loss(steps, logits, **kw)
    assert torch.equal(counts.acc_count, counts_all.acc_count)
    assert (counts.loss_count < counts_all.loss_count).all()
    # a draft that agrees with the uniform row's argmax (draft id 0) would be right with no mask
    agree = [torch.zeros_like(s) for s in steps]
    for a in agree:
        a[..., 0] = 1.0
    _, right = eagle3_loss(agree, logits, **kw)
    _, missed = eagle3_loss(agree, logits, covered=covered, **kw)
    assert (missed.correct_full <= right.correct_full).all() and missed.correct_full.sum() < right.correct_full.sum()
    with_mask = replay_counts(
        agree, logits, loss_mask=PACKED_ANSWERS, segment_ids=PACKED_SEGMENTS, num_draft_tokens=3, covered=covered
    )
    without = replay_counts(agree, logits, loss_mask=PACKED_ANSWERS, segment_ids=PACKED_SEGMENTS, num_draft_tokens=3)
    assert with_mask[1] < without[1]  # fewer drafts accepted


def test_a_batch_with_neither_teacher_is_refused_by_name():
    head, _ = _head_and_full_lm()
    batch = {k: v for k, v in _final_batch().items() if k != "final_hidden"}
    batch["teacher_ids"] = torch.zeros(1, 12, 4, dtype=torch.int64)
    with pytest.raises(TeacherBatchError, match="teacher_logprobs"):
        head.teacher_logits(batch)
    with pytest.raises(ValueError, match=r"same shape \[B, T, k\]"):
        topk_target_logits(torch.zeros(1, 2, 3, dtype=torch.int64), torch.zeros(1, 2, 4), head.target_to_draft, V)


def test_the_index_follows_a_loaded_state_dict():
    head, _ = _head_and_full_lm(0)
    other, _ = _head_and_full_lm(1)  # another draft vocab
    assert not torch.equal(head.target_to_draft, other.target_to_draft)
    other.load_state_dict(head.state_dict(), strict=False)  # d2t/t2d from a checkpoint
    assert torch.equal(head.target_to_draft, other.target_to_draft)
    assert "target_to_draft" not in head.state_dict()  # derived from d2t, never saved


def test_head_replay_counts_the_same_from_either_batch():
    head, full = _head_and_full_lm()
    final = _final_batch()
    out = []
    for batch in (final, _topk_batch(head, full, final, VT)):
        counts, replay = add_batch(
            head,
            batch,
            *_zeros(3),
            num_draft_tokens=3,
            max_answer_tokens=None,
            first_span_only=False,
            device="cpu",
        )
        out.append((counts.stacked(), replay))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-4, atol=1e-5)
    assert torch.equal(out[0][1], out[1][1]) and out[0][1][0] > 0


def _zeros(k: int):
    from eagle3.draft.loss import StepCounts

    return StepCounts.zeros(k), torch.zeros(2 + k, dtype=torch.float64)


class _Losses(L.Callback):
    def __init__(self):
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def test_lightning_trains_on_topk_batches_towards_the_teacher():
    head, full = _head_and_full_lm()
    final = _final_batch()
    topk = _topk_batch(head, full, final, 8)
    cfg = TrainConfig(ttt_steps=2, compile=False, lr=3e-3, max_steps=12, warmup_steps=0)
    module = Eagle3LitModule(head.train(), cfg, replay_draft_tokens=0)
    with torch.no_grad():
        before = module._forward_loss(final)[0].item()  # against the exact teacher
    losses = _Losses()
    trainer = quiet_cpu_trainer(
        max_steps=12,
        limit_val_batches=0,
        callbacks=[losses],
    )
    loader = torch.utils.data.DataLoader([topk] * 12, batch_size=None)  # one fixed batch, 12 times
    trainer.fit(module, loader)
    assert len(losses.losses) == 12 and all(math.isfinite(x) for x in losses.losses)
    assert losses.losses[-1] < 0.8 * losses.losses[0]
    with torch.no_grad():
        after = module._forward_loss(final)[0].item()
    # trained only on the top-8, the head moved towards the full teacher as well
    assert after < 0.9 * before
