"""Eagle3DraftHead + eagle3_loss: packing, the shift convention, counts, frozen parts, export."""

import json
import math

import pytest
import torch
from helpers.heads import VT, H, V, make_head

from eagle3.draft import (
    DraftConfig,
    DraftConfigError,
    StepCounts,
    TargetWeightsError,
    eagle3_loss,
    export_state_dict,
    sim_accept_len,
)
from eagle3.draft.loss import LOSS_KINDS, TargetStats, per_position_loss, step_positions
from eagle3.draft.rope import inverse_frequencies


def sample(t: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return dict(
        aux=torch.randn(t, 3 * H, generator=g),
        ids=torch.randint(0, VT, (t,), generator=g),
        z=torch.randn(t, H, generator=g),
        mask=torch.arange(t) >= 2,  # a 2-token "prompt", then assistant tokens
    )


def run(head, aux, ids, seg, steps, pos=None):
    if pos is None:
        pos = torch.arange(ids.shape[1]).expand_as(ids)
    return head(aux, ids, pos, seg, steps)


def test_packed_row_equals_samples_run_separately():
    head = make_head()
    a, b = sample(5, 1), sample(7, 2)
    pad = 3
    aux = torch.cat([a["aux"], b["aux"], torch.randn(pad, 3 * H)])[None]
    ids = torch.cat([a["ids"], b["ids"], torch.zeros(pad, dtype=torch.long)])[None]
    z = torch.cat([a["z"], b["z"], torch.randn(pad, H)])[None]
    mask = torch.cat([a["mask"], b["mask"], torch.ones(pad, dtype=torch.bool)])[None]  # padding mask=1 on purpose
    seg = torch.tensor([[0] * 5 + [1] * 7 + [-1] * pad])
    pos = torch.cat([torch.arange(5), torch.arange(7), torch.zeros(pad, dtype=torch.long)])[None]
    steps = 3
    packed = run(head, aux, ids, seg, steps, pos)
    loss_p, counts_p = eagle3_loss(packed, head.target_logits(z), loss_mask=mask, segment_ids=seg, step_decay=0.8)

    total = StepCounts.zeros(steps)
    for s, sl in ((a, slice(0, 5)), (b, slice(5, 12))):
        n = s["ids"].shape[0]
        sep = run(head, s["aux"][None], s["ids"][None], torch.zeros(1, n, dtype=torch.long), steps)
        for k in range(steps):
            valid = n - 1 - k  # positions whose consumed token x_{t+1+k} exists
            torch.testing.assert_close(packed[k][0, sl][:valid], sep[k][0, :valid], rtol=1e-5, atol=1e-5)
        _, c = eagle3_loss(
            sep,
            head.target_logits(s["z"][None]),
            loss_mask=s["mask"][None],
            segment_ids=torch.zeros(1, n, dtype=torch.long),
            step_decay=0.8,
        )
        total = total + c
    for name in ("loss_count", "acc_count", "correct_full", "cond_count"):
        assert torch.equal(getattr(counts_p, name), getattr(total, name)), name
    torch.testing.assert_close(counts_p.loss_sum, total.loss_sum, rtol=1e-5, atol=1e-6)
    expected = sum(0.8**k * total.loss_mean()[k] for k in range(steps))
    torch.testing.assert_close(loss_p.double(), expected, rtol=1e-5, atol=1e-6)
    # sample A has 5 tokens, mask from index 2: step k counts t with t+2+k <= 4 and t+2+k >= 2
    assert counts_p.loss_count.tolist() == [3 + 5, 2 + 4, 1 + 3]


def test_draft_never_sees_the_token_it_predicts():
    head = make_head()
    s = sample(16, 3)
    t = 16
    seg = torch.zeros(1, t, dtype=torch.long)
    steps = 4
    base = run(head, s["aux"][None], s["ids"][None], seg, steps)
    for cut in (5, 9):
        ids2 = s["ids"].clone()
        ids2[cut:] = (ids2[cut:] + 1 + torch.arange(t - cut)) % VT  # every token from `cut` on changes
        aux2 = s["aux"].clone()
        aux2[cut:] += 1.0  # and so do the aux features there
        out = run(head, aux2[None], ids2[None], seg, steps)
        for k in range(steps):
            # step k at t reads x_{t+1+k} and g_{<=t}; it predicts x_{t+2+k}
            blind = cut - 1 - k  # t < blind: nothing read is perturbed (x_{t+2+k} = x_cut may be)
            torch.testing.assert_close(out[k][0, :blind], base[k][0, :blind], rtol=0, atol=0)
            # and the first position that reads x_cut does change: the test can fail
            assert not torch.allclose(out[k][0, blind], base[k][0, blind])


def test_only_relative_positions_matter():
    # speculators trains step k at t with rope position t+1+k, vLLM serves it at t+k: the
    # same model only because rope sees position differences; this pins that down
    head = make_head()
    s = sample(12, 6)
    seg = torch.zeros(1, 12, dtype=torch.long)
    pos = torch.arange(12)[None]
    base = run(head, s["aux"][None], s["ids"][None], seg, 3, pos)
    moved = run(head, s["aux"][None], s["ids"][None], seg, 3, pos - 1)
    for k in range(3):
        torch.testing.assert_close(moved[k], base[k], rtol=1e-4, atol=1e-4)


def test_gradient_of_step_k_at_t_reaches_no_later_aux_feature():
    head = make_head()
    s = sample(10, 4)
    aux = s["aux"][None].clone().requires_grad_(True)
    out = run(head, aux, s["ids"][None], torch.zeros(1, 10, dtype=torch.long), 3)
    t = 4
    for k in range(3):
        (grad,) = torch.autograd.grad(out[k][0, t].sum(), aux, retain_graph=True)
        per_pos = grad[0].abs().sum(-1)
        assert (per_pos[t + 1 :] == 0).all(), f"step {k} at t={t} depends on g_s for s>t"
        assert (per_pos[: t + 1] > 0).all()


def test_loss_counts_and_perfect_draft():
    torch.manual_seed(0)
    b, t, steps = 2, 9, 3
    target = torch.randn(b, t, V)
    seg = torch.tensor([[0] * 4 + [1] * 5, [0] * 7 + [-1] * 2])
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[0, 4] = False  # first token of the second sample is "prompt"
    # a draft that equals the target distribution 1+k positions later: KL 0, all correct
    perfect = []
    for k in range(steps):
        shifted = torch.full_like(target, 0.0)
        shifted[:, : t - 1 - k] = target[:, 1 + k :]
        perfect.append(shifted.clone().requires_grad_(True))
    loss, counts = eagle3_loss(perfect, target, loss_mask=mask, segment_ids=seg, step_decay=0.8)
    # row 0: samples of 4 and 5 tokens; row 1: 7 tokens. Step k counts t with x_{t+2+k} in sample and masked.
    # sample lengths n contribute max(n-2-k, 0); sample B's token 4 (its index 0) is never a target anyway
    assert counts.loss_count.tolist() == [2 + 3 + 5, 1 + 2 + 4, 0 + 1 + 3]
    assert counts.acc_count.tolist() == counts.loss_count.tolist()
    assert counts.correct_full.tolist() == counts.acc_count.tolist()
    assert abs(loss.item()) < 1e-5
    assert sim_accept_len(counts) == pytest.approx(1.0 + steps)

    # break step 1 everywhere: acc_1 = acc_2 = 0 ("full"), cond_acc_2 = 0/0 -> 0, loss grows
    broken = [perfect[0], -perfect[1].detach(), perfect[2]]
    loss_b, counts_b = eagle3_loss(broken, target, loss_mask=mask, segment_ids=seg, step_decay=0.8, kind="ce_argmax")
    assert counts_b.correct_full.tolist() == [10, 0, 0]
    assert counts_b.cond_count.tolist() == [10, 7, 0]
    assert sim_accept_len(counts_b) == pytest.approx(2.0)
    assert loss_b.item() > 1.0


def test_accuracy_requires_the_chain_to_start_on_a_trained_token():
    torch.manual_seed(1)
    t = 8
    target = torch.randn(1, t, V)
    mask = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    seg = torch.zeros(1, t, dtype=torch.long)
    loss_pos = step_positions(mask, seg, 3)
    # step 2 at t=0 predicts x_4 (trained) but its step-0 token x_2 is prompt: loss yes, accuracy no
    assert bool(loss_pos[2][0, 0]) and not bool(loss_pos[0][0, 0])
    logits = [torch.randn(1, t, V) for _ in range(3)]
    _, counts = eagle3_loss(logits, target, loss_mask=mask, segment_ids=seg, step_decay=1.0)
    # loss: t with x_{t+2+k} in 4..7; accuracy: also x_{t+2} in 4..7 (t >= 2)
    assert counts.loss_count.tolist() == [4, 4, 4]
    assert counts.acc_count.tolist() == [4, 3, 2]
    mask2 = torch.tensor([[0, 0, 0, 1, 1, 0, 1, 1]], dtype=torch.bool)
    _, c2 = eagle3_loss(logits, target, loss_mask=mask2, segment_ids=seg, step_decay=1.0)
    # trained x_3, x_4, x_6, x_7. step 2 loss: t in {0, 2, 3}; accuracy also needs x_{t+2}: t = 2 only
    assert c2.loss_count.tolist() == [4, 4, 3] and c2.acc_count.tolist() == [4, 2, 1]


def test_target_logits_are_the_renormalised_target_distribution():
    head = make_head()
    z = torch.randn(2, 5, H)
    full_lm = torch.randn(VT, H)
    head.load_target_weights(
        head.embed_tokens.weight.clone(),
        head.target_norm.weight.clone(),
        full_lm,
        head.d2t.clone(),
        head.t2d.clone(),
        init_lm_head_from_target=False,
    )
    full_p = head.target_norm(z) @ full_lm.T
    full_p = full_p.softmax(-1)[..., head.t2d]
    torch.testing.assert_close(head.target_logits(z).softmax(-1), full_p / full_p.sum(-1, keepdim=True))


def test_load_target_weights_rejects_inconsistent_vocab_maps():
    head = make_head()
    d2t, t2d = head.d2t.clone(), head.t2d.clone()
    bad = d2t.clone()
    bad[3] += 1
    with pytest.raises(TargetWeightsError, match="d2t and t2d disagree"):
        head.load_target_weights(torch.randn(VT, H), torch.ones(H), torch.randn(VT, H), bad, t2d, False)
    with pytest.raises(TargetWeightsError, match=r"embed_tokens has shape \(96, 32\), expected \(97, 32\)"):
        head.load_target_weights(torch.randn(VT - 1, H), torch.ones(H), torch.randn(VT, H), d2t, t2d, False)


def test_only_the_draft_trains_and_frozen_parts_get_no_gradient():
    head = make_head().train()
    s = sample(8, 5)
    seg = torch.zeros(1, 8, dtype=torch.long)
    out = run(head, s["aux"][None], s["ids"][None], seg, 2)
    loss, _ = eagle3_loss(
        out, head.target_logits(s["z"][None]), loss_mask=s["mask"][None], segment_ids=seg, step_decay=0.8
    )
    loss.backward()
    trainable = {n for n, p in head.named_parameters() if p.requires_grad}
    assert trainable == {
        "fc.weight",
        "norm.weight",
        "lm_head.weight",
        "layers.0.input_layernorm.weight",
        "layers.0.hidden_norm.weight",
        "layers.0.post_attention_layernorm.weight",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.self_attn.k_proj.weight",
        "layers.0.self_attn.v_proj.weight",
        "layers.0.self_attn.o_proj.weight",
        "layers.0.mlp.gate_proj.weight",
        "layers.0.mlp.up_proj.weight",
        "layers.0.mlp.down_proj.weight",
    }
    for n, p in head.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, n
        else:
            assert p.grad is None, n


def test_export_names_are_the_serving_names():
    head = make_head(norm_before_fc=True)
    sd = export_state_dict(head)
    assert set(sd) == {
        "fc.weight",
        "input_norm.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
        "layers.0.input_layernorm.weight",
        "layers.0.hidden_norm.weight",
        "layers.0.post_attention_layernorm.weight",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.self_attn.k_proj.weight",
        "layers.0.self_attn.v_proj.weight",
        "layers.0.self_attn.o_proj.weight",
        "layers.0.mlp.gate_proj.weight",
        "layers.0.mlp.up_proj.weight",
        "layers.0.mlp.down_proj.weight",
    }
    assert sd["fc.weight"].dtype == torch.bfloat16 and sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool
    assert sd["layers.0.self_attn.q_proj.weight"].shape == (4 * 8, 2 * H)
    assert "embed_tokens.weight" in export_state_dict(head, include_embed_tokens=True)


def test_fc_norm_exports_one_norm_per_aux_layer_and_excludes_norm_before_fc():
    head = make_head(fc_norm=True, norm_output=True, norm_before_residual=True)
    sd = export_state_dict(head)
    assert {k for k in sd if "norm" in k and not k.startswith("layers.")} == {
        "norm.weight",
        "fc_norm.0.weight",
        "fc_norm.1.weight",
        "fc_norm.2.weight",
    }
    assert all(sd[f"fc_norm.{i}.weight"].shape == (H,) for i in range(3))
    with pytest.raises(DraftConfigError, match="norm_before_fc and fc_norm are mutually exclusive"):
        make_head(norm_before_fc=True, fc_norm=True)


def test_norm_output_changes_only_the_steps_after_the_first():
    s = sample(12, 7)
    seg = torch.zeros(1, 12, dtype=torch.long)
    base = run(make_head(seed=3), s["aux"][None], s["ids"][None], seg, 3)
    normed = run(make_head(seed=3, norm_output=True), s["aux"][None], s["ids"][None], seg, 3)
    torch.testing.assert_close(normed[0], base[0], rtol=0, atol=0)
    assert not torch.allclose(normed[1], base[1]) and not torch.allclose(normed[2], base[2])


@pytest.mark.parametrize("kind", LOSS_KINDS)
def test_every_loss_is_zero_for_a_perfect_draft_and_positive_otherwise(kind):
    torch.manual_seed(8)
    target = torch.randn(2, 6, V) * 2
    stats = TargetStats.from_logits(target, kind)
    if kind == "ce_argmax":  # cross-entropy against argmax p is zero only for a one-hot draft
        perfect = torch.full_like(target, -1e4).scatter(-1, target.argmax(-1, keepdim=True), 1e4)
    else:
        perfect = target + 3.0  # the same distribution: softmax ignores a shift
    torch.testing.assert_close(per_position_loss(perfect, stats, 0, kind), torch.zeros(2, 6), rtol=0, atol=1e-5)
    other = per_position_loss(torch.randn(2, 6, V) * 2, stats, 0, kind)
    assert (other > 1e-3).all()
    bound = {"jsd": math.log(2.0), "tv": 1.0}.get(kind)
    if bound is not None:
        assert (other <= bound).all()


def test_draft_config_from_the_real_smollm2_config(smollm2_dir):
    smollm2_config = json.loads((smollm2_dir / "config.json").read_text())
    cfg = DraftConfig.from_target_config(smollm2_config, draft_vocab_size=32000, num_aux_layers=3)
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (576, 9, 3, 64)
    assert (cfg.intermediate_size, cfg.target_vocab_size, cfg.rope_theta) == (1536, 49152, 100000.0)
    assert cfg.rms_norm_eps == pytest.approx(1e-5) and cfg.rope_scaling is None
    small = DraftConfig.from_target_config(smollm2_config, 32000, 3, intermediate_size=512)
    assert small.intermediate_size == 512


def test_draft_config_for_a_deepseek_v3_target_uses_a_plain_llama_layer():
    kimi_like = {
        "model_type": "kimi_k25",
        "text_config": {
            "model_type": "deepseek_v3",
            "hidden_size": 7168,
            "num_attention_heads": 64,
            "num_key_value_heads": 64,
            "intermediate_size": 18432,
            "vocab_size": 163840,
            "rms_norm_eps": 1e-6,
            "head_dim": 64,
            "max_position_embeddings": 262144,
            "rope_theta": 50000.0,
            "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096},
        },
    }
    cfg = DraftConfig.from_target_config(kimi_like, draft_vocab_size=32000, num_key_value_heads=8)
    # MLA's head_dim (the rope part, 64) and yarn describe the target's attention, not ours
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (7168, 64, 8, 112)
    assert cfg.rope_scaling is None and cfg.rope_theta == 50000.0 and cfg.target_vocab_size == 163840


def test_the_model_package_imports_neither_lightning_nor_hydra():
    import subprocess
    import sys

    code = "import sys, eagle3.draft; print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning', 'hydra', 'omegaconf')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_llama3_rope_frequencies_match_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    hf = LlamaConfig(
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_parameters={"rope_theta": 500000.0, **scaling},
    )
    cfg = DraftConfig.from_target_config(hf.to_dict(), draft_vocab_size=32000)
    assert cfg.rope_type == "llama3"
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    torch.testing.assert_close(inverse_frequencies(cfg), ref.float(), rtol=1e-6, atol=0)
