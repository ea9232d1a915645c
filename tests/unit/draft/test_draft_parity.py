"""Parity with speculators 0.9's Eagle3DraftModel (the peer vLLM's own project trains with).

Same weights, same inputs: per-step logits, loss and "full" accuracy counts agree (fp32).
speculators is fed what its `shift_batch` would produce from our aligned sample:
input_ids x[1:], hidden g[:-1], target states z[1:], position ids 1..T-1.
Its loss mask at index i is the mask of the token the step-0 draft at i predicts; ours is
given per token (x_t) and the loss shifts it (loss.py), so we hand it mask[i + 2].
"""

import json
import warnings
from dataclasses import replace

import pytest
import torch
from safetensors.torch import save_file

from eagle3.draft import DraftConfig, Eagle3DraftHead, eagle3_loss, export_state_dict, speculators_config_dict
from eagle3.draft.config import NORM_OPTIONS
from eagle3.draft.loss import TargetStats, per_position_loss
from eagle3.draft.serving_format import transformer_layer_config_dict

pytest.importorskip("speculators")
warnings.filterwarnings("ignore", module="speculators")

from speculators.config import SpeculatorsConfig, VerifierConfig  # noqa: E402
from speculators.losses import resolve_loss_config  # noqa: E402
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig  # noqa: E402
from speculators.proposals.greedy import GreedyTokenProposalConfig  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

H, VT, AUX_IDS = 64, 300, [1, 2, 3]
LOGIT_TOL = dict(rtol=1e-5, atol=1e-5)  # measured: max |diff| <= 1.5e-7 in fp32; loss rel. diff ~2e-6


def _target_config() -> LlamaConfig:
    return LlamaConfig(
        hidden_size=H,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=4,
        vocab_size=VT,
        rms_norm_eps=1e-5,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
    )


def _head_from_target(
    target: LlamaForCausalLM, draft_vocab: int, seed: int, layers: int = 1, **norms: bool
) -> Eagle3DraftHead:
    torch.manual_seed(seed)
    cfg = DraftConfig.from_target_config(
        target.config.to_dict(), draft_vocab_size=draft_vocab, num_aux_layers=3, num_layers=layers, **norms
    )
    head = Eagle3DraftHead(cfg)
    t2d = torch.zeros(VT, dtype=torch.bool)
    t2d[torch.randperm(VT)[:draft_vocab]] = True
    d2t = t2d.nonzero().squeeze(1) - torch.arange(draft_vocab)
    head.load_target_weights(
        target.model.embed_tokens.weight,
        target.model.norm.weight,
        target.lm_head.weight,
        d2t,
        t2d,
        init_lm_head_from_target=True,
    )
    with torch.no_grad():  # move every norm off 1 so a swapped norm would show
        for p in head.parameters():
            if p.requires_grad and p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return head.eval()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    torch.manual_seed(0)
    model = LlamaForCausalLM(_target_config())
    with torch.no_grad():
        model.model.norm.weight.add_(0.2 * torch.randn(H))
    path = tmp_path_factory.mktemp("verifier")
    model.save_pretrained(path)
    return model, path


def _speculators_logits(ref: Eagle3DraftModel, g, ids, z=None, spec_mask=None, steps=3, decay=1.0, loss="kl_div"):
    """Run speculators on the shifted sample; return (per-step logits, loss, metrics)."""
    captured = []
    hook = ref.lm_head.register_forward_hook(lambda m, i, o: captured.append(o.detach()))
    t = ids.shape[1]
    kwargs = {}
    if z is not None:
        kwargs = dict(
            verifier_last_hidden_states=z[:, 1:],
            loss_mask=spec_mask,
            ttt_step_loss_decay=decay,
            loss_config=resolve_loss_config(loss, "eager"),
        )  # the fused losses are Triton-only
    with torch.no_grad():
        out = ref(
            hidden_states=g[:, :-1],
            input_ids=ids[:, 1:],
            document_ids=torch.zeros(1, t - 1, dtype=torch.long),
            position_ids=torch.arange(1, t)[None],
            ttt_steps=steps,
            **kwargs,
        )
    hook.remove()
    return captured, out


def _export_and_load_in_speculators(head: Eagle3DraftHead, vpath, out_dir, steps: int) -> Eagle3DraftModel:
    # embed_tokens goes in the file: speculators 0.9 copies the target's embeddings only when
    # its own (uninitialised, not NaN-filled under transformers 5) tensor holds a NaN, which
    # is luck; vLLM shares the target's embeddings when the file has none
    save_file(export_state_dict(head, include_embed_tokens=True, dtype=None), out_dir / "model.safetensors")
    config = speculators_config_dict(head.cfg, AUX_IDS, str(vpath), steps, target_architectures=["LlamaForCausalLM"])
    (out_dir / "config.json").write_text(json.dumps(config))
    ref = Eagle3DraftModel.from_pretrained(str(out_dir)).float().eval()  # its default flex attention
    assert len(ref.layers) == head.cfg.num_layers
    for ours, theirs in (
        (head.lm_head, ref.lm_head),
        (head.target_lm_head, ref.verifier_lm_head),
        (head.embed_tokens, ref.embed_tokens),
        (head.target_norm, ref.verifier_norm),
    ):
        assert torch.equal(ours.weight, theirs.weight)
    assert torch.equal(ref.d2t, head.d2t) and torch.equal(ref.t2d, head.t2d)
    return ref


T = 129  # flex attention's block mask wants the shifted length (128) to be a block multiple


def _random_sample(seed: int = 2):
    torch.manual_seed(seed)
    return torch.randint(0, VT, (1, T)), torch.randn(1, T, 3 * H)


def _our_logits(head: Eagle3DraftHead, ids, g, steps: int) -> list[torch.Tensor]:
    return head(g, ids, torch.arange(T)[None], torch.zeros(1, T, dtype=torch.long), steps)


def _assert_same_logits(ours, theirs, steps: int) -> None:
    assert len(theirs) == len(ours) == steps
    for k in range(steps):
        n = T - 1 - k  # positions whose consumed token exists; the rest are padding in both
        torch.testing.assert_close(ours[k][0, :n], theirs[k][0, :n], **LOGIT_TOL)


@pytest.mark.parametrize("steps,layers", [(1, 1), (3, 1), (3, 2), (3, 3)])
def test_our_export_loads_in_speculators_and_gives_the_same_logits(target, tmp_path, steps, layers):
    model, vpath = target
    head = _head_from_target(model, draft_vocab=120, seed=1, layers=layers)
    ref = _export_and_load_in_speculators(head, vpath, tmp_path, steps)
    ids, g = _random_sample()
    theirs, _ = _speculators_logits(ref, g, ids, steps=steps)
    _assert_same_logits(_our_logits(head, ids, g, steps), theirs, steps)


@pytest.mark.parametrize(
    "norms,layers",
    [
        ({"norm_before_fc": True}, 1),
        ({"fc_norm": True}, 1),
        ({"norm_output": True}, 1),
        ({"norm_before_residual": True}, 1),
        ({"fc_norm": True, "norm_output": True, "norm_before_residual": True}, 2),  # all that go together
    ],
    ids=lambda v: "+".join(v) if isinstance(v, dict) else f"{v}layers",
)
def test_norm_options_give_the_same_logits_in_speculators_and_after_our_reload(target, tmp_path, norms, layers):
    """Each EAGLE-3.1 norm option, on, in our head and in speculators' Eagle3DraftModel built
    from our export: same per-step logits. The head's norms are off 1 (_head_from_target),
    so a side that ignored an option would differ, which the same head with the option off
    shows. load_exported_head (the evaluation's reader) rebuilds the same head."""
    from eagle3.evaluation.diagnostics.head_replay import load_exported_head

    model, vpath = target
    steps = 3  # norm_output only acts from the second step on
    head = _head_from_target(model, draft_vocab=120, seed=5, layers=layers, **norms)
    ref = _export_and_load_in_speculators(head, vpath, tmp_path, steps)
    for name, value in norms.items():
        assert getattr(ref.config, name) is value
    ids, g = _random_sample()
    theirs, _ = _speculators_logits(ref, g, ids, steps=steps)
    ours = _our_logits(head, ids, g, steps)
    _assert_same_logits(ours, theirs, steps)

    off = Eagle3DraftHead(replace(head.cfg, **{name: False for name in norms}))
    off.load_state_dict(head.state_dict(), strict=False)  # fc_norm.* has no place in it
    ignored = _our_logits(off.eval(), ids, g, steps)
    assert not torch.allclose(ignored[-1][0, : T - steps], theirs[-1][0, : T - steps], **LOGIT_TOL)

    reloaded, aux_layer_ids = load_exported_head(tmp_path, vpath)
    assert aux_layer_ids == AUX_IDS and reloaded.cfg.norm_options == head.cfg.norm_options
    for k, (a, b) in enumerate(zip(_our_logits(reloaded, ids, g, steps), ours)):
        torch.testing.assert_close(a[0, : T - 1 - k], b[0, : T - 1 - k], **LOGIT_TOL)


# our train.loss kinds and speculators 0.9's names for the same per-position divergence
SPECULATORS_LOSS = {"forward_kl": "kl_div", "reverse_kl": "rkl", "jsd": "jsd", "tv": "tv", "ce_argmax": "ce"}


@pytest.mark.parametrize("kind", sorted(SPECULATORS_LOSS))
def test_per_position_losses_equal_speculators_eager_implementation(kind):
    torch.manual_seed(6)
    draft, target = torch.randn(2, 33, 120) * 3, torch.randn(2, 33, 120) * 3
    [(theirs, _)] = resolve_loss_config(SPECULATORS_LOSS[kind], "eager").values()
    ours = per_position_loss(draft, TargetStats.from_logits(target, kind), 0, kind)
    torch.testing.assert_close(ours, theirs(draft, target), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "steps,kind",
    [(1, "forward_kl"), (3, "forward_kl")] + [(3, kind) for kind in ("reverse_kl", "jsd", "tv", "ce_argmax")],
)
def test_loss_and_full_accuracy_match_speculators_eager_loss(target, steps, kind):
    model, vpath = target
    draft_vocab = 2  # tiny draft vocab: random drafts agree with the target often enough that
    # every step has correct chains to count (measured: 14, 7, 4 at 3 steps)
    head = _head_from_target(model, draft_vocab=draft_vocab, seed=3)
    tl = _target_config()
    tl.num_hidden_layers = 1
    tl._attn_implementation = "eager"  # a second attention path: eager softmax with a float mask
    spec_cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=tl,
        draft_vocab_size=draft_vocab,
        norm_before_residual=False,
        eagle_aux_hidden_state_layer_ids=AUX_IDS,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=steps)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=None, architectures=[]),
        ),
    )
    ref = Eagle3DraftModel(spec_cfg).float().eval()
    state = export_state_dict(head, include_embed_tokens=True, dtype=None)
    state["verifier_lm_head.weight"] = head.target_lm_head.weight
    state["verifier_norm.weight"] = head.target_norm.weight
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert missing == [] and unexpected == []

    t = 40
    torch.manual_seed(4)
    ids, g, z = torch.randint(0, VT, (1, t)), torch.randn(1, t, 3 * H), torch.randn(1, t, H) * 3
    mask = torch.zeros(1, t, dtype=torch.bool)
    mask[0, 6:22] = True  # prompt, an assistant span, a user turn, another assistant span
    mask[0, 27:] = True
    spec_mask = torch.zeros(1, t - 1, dtype=torch.bool)
    spec_mask[0, : t - 2] = mask[0, 2:]
    decay = 0.8
    theirs, (_, their_loss, metrics) = _speculators_logits(
        ref, g, ids, z, spec_mask, steps, decay, SPECULATORS_LOSS[kind]
    )

    ours = head(g, ids, torch.arange(t)[None], torch.zeros(1, t, dtype=torch.long), steps)
    loss, counts = eagle3_loss(
        ours,
        head.target_logits(z),
        loss_mask=mask,
        segment_ids=torch.zeros(1, t, dtype=torch.long),
        step_decay=decay,
        kind=kind,
    )
    for k in range(steps):
        torch.testing.assert_close(ours[k][0, : t - 1 - k], theirs[k][0, : t - 1 - k], **LOGIT_TOL)
    # their per-step denominator is mask.sum() + 1e-5: relative 1e-5 / 16 at most
    torch.testing.assert_close(loss, their_loss, rtol=1e-5, atol=1e-6)
    for k in range(steps):
        torch.testing.assert_close(
            decay**k * counts.loss_mean()[k].float(), metrics[f"loss_{k}_sum"], rtol=1e-5, atol=1e-6
        )
        assert counts.correct_full[k] == metrics[f"full_acc_{k}_sum"]
        # speculators divides by every loss position (chains starting on a prompt token can
        # never count as correct there); we divide by acc_count, chains starting on a trained token
        assert counts.loss_count[k] == metrics[f"full_acc_{k}_total"]
    assert (counts.correct_full > 0).all()  # the comparison above is not 0 == 0


def test_config_matches_what_speculators_itself_writes(smollm2_dir):
    SMOLLM2 = str(smollm2_dir)
    from speculators.train.cli import create_transformer_layer_config

    target = json.loads(open(f"{SMOLLM2}/config.json").read())
    cfg = DraftConfig.from_target_config(target, draft_vocab_size=32000, num_aux_layers=3)
    theirs_tl = create_transformer_layer_config(SMOLLM2, 1, "llama", None, 0, [0])
    ours_tl = transformer_layer_config_dict(cfg)
    their_tl_dict = theirs_tl.to_dict()
    for key, value in ours_tl.items():
        assert their_tl_dict[key] == value, key

    ours = speculators_config_dict(cfg, [2, 15, 27], SMOLLM2, 3, target_architectures=["LlamaForCausalLM"])
    theirs = Eagle3SpeculatorConfig(
        transformer_layer_config=theirs_tl,
        draft_vocab_size=32000,
        norm_before_residual=False,
        eagle_aux_hidden_state_layer_ids=[2, 15, 27],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(SMOLLM2),
        ),
    )
    theirs = json.loads(theirs.to_json_string())  # what save_pretrained puts in config.json
    skip = {"transformer_layer_config", "architectures", "transformers_version"}
    assert {k: v for k, v in ours.items() if k not in skip} == {k: v for k, v in theirs.items() if k not in skip}
    assert ours["architectures"] == ["Eagle3DraftModel"]  # what speculators' save_pretrained writes
    # and speculators parses ours back
    parsed = Eagle3SpeculatorConfig(**ours)
    assert parsed.transformer_layer_config.head_dim == 64 and parsed.draft_vocab_size == 32000


@pytest.mark.parametrize(
    "norms", [{}, {"norm_before_fc": True}, {"fc_norm": True, "norm_output": True, "norm_before_residual": True}]
)
def test_vllm_reads_our_config_as_eagle3_with_our_flags(smollm2_dir, norms):
    SMOLLM2 = str(smollm2_dir)
    base = pytest.importorskip("vllm.transformers_utils.configs.speculators.base")
    cfg = DraftConfig.from_target_config(json.loads(open(f"{SMOLLM2}/config.json").read()), 32000, 3, **norms)
    ours = speculators_config_dict(cfg, [2, 15, 27], SMOLLM2, 3)
    pre = base.SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(ours)))
    assert pre["architectures"] == ["Eagle3LlamaForCausalLM"]
    # the flags llama_eagle3 reads, as set; vLLM's default for a missing norm_before_residual is True
    assert (
        {name: pre[name] for name in NORM_OPTIONS}
        == cfg.norm_options
        == {**dict.fromkeys(NORM_OPTIONS, False), **norms}
    )
    assert pre["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27] and pre["draft_vocab_size"] == 32000
    assert base.SpeculatorsConfig.extract_vllm_speculative_config(ours) == {
        "method": "eagle3",
        "num_speculative_tokens": 3,
    }
