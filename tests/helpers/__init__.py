"""Builders shared by test modules (a test module never imports another): `from helpers import ...`."""

from __future__ import annotations

from pathlib import Path

import torch


def random_head_export(
    out_dir: Path, target_dir: Path, layers: int = 1, num_draft_tokens: int = 3, **norms: bool
) -> Path:
    """A SmolLM2 EAGLE-3 head built as train.py builds one, with a random draft lm_head
    (nothing copied from the target's), exported in our serving format at ``num_draft_tokens``;
    `norms`: the EAGLE-3.1 norm options (eagle3/draft/config.py NORM_OPTIONS) it is built with."""
    from eagle3.data.vocab import build_draft_vocab
    from eagle3.draft.config import DraftConfig
    from eagle3.draft.head import Eagle3DraftHead
    from eagle3.draft.serving_format import DraftMeta, save_head
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


def tiny_head_with_meta(seed: int = 0, num_draft_tokens: int = 3):
    """A random 32-wide draft head (target vocabulary 97, draft vocabulary its first 40 ids) and the
    DraftMeta an export of it holds: the smallest head every export path accepts."""
    from eagle3.draft.config import DraftConfig
    from eagle3.draft.head import Eagle3DraftHead
    from eagle3.draft.serving_format import DraftMeta

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


def tear_writes(monkeypatch) -> None:
    """Every Path.write_text/write_bytes writes half its data, then fails as a full disk does."""
    import errno

    def half(self, data, *args, **kwargs):
        raw = data.encode() if isinstance(data, str) else data
        with open(self, "wb") as f:
            f.write(raw[: len(raw) // 2])
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", half)
    monkeypatch.setattr(Path, "write_bytes", half)
