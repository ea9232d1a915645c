"""Eagle3DraftHead: the EAGLE-3 draft head with training-time test (TTT), a plain nn.Module.

Index convention (all inputs aligned at the same positions t of a packed row):
    input_ids[t] = x_t, aux_hidden[t] = g_t (aux layers' states after processing x_t),
    final hidden z_t (the target's last state after x_t; p_t = softmax(lm_head(norm(z_t)))
    is the target's distribution of x_{t+1}).

TTT step k (k = 0 .. ttt_steps-1) at position t
    consumes  embed(x_{t+1+k})  and  h_{k-1}(t)   (h_{-1}(t) = fc(g_t); h_{k-1} is the layer
              output of step k-1 at t, before the final norm, or after it with norm_output)
    rope position  position_ids[t] + 1 + k   (the position of the token it consumes, as
              speculators trains; vLLM serves with position_ids[t] + k: the same, since rope
              only sees differences and every key/query of the row moves together)
    attends   step-0 keys at positions s <= t of its own sample, and its own keys at t from
              steps 1..k (the diagonal)
    predicts  x_{t+2+k}: logits_k[t] is trained against p_{t+1+k} on the draft vocab.
If x_{t+1+k} lies past the end of t's sample, the input token is a pad (id 0) and logits_k[t]
is garbage that only position t itself ever sees; the loss masks it (loss.py).

This equals speculators 0.9 Eagle3DraftModel after its `shift_batch` (its index i is our
t = i, its position ids are ours + 1), except that we never let step k read the next packed
sample's tokens: speculators shifts across the packed row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from eagle3.draft.config import DraftConfig
from eagle3.draft.flex import build_flex_masks
from eagle3.draft.layers import DraftDecoderLayer, Eagle3DecoderLayer, RMSNorm
from eagle3.draft.mask import build_ttt_mask, ttt_step_mask
from eagle3.draft.rope import RotaryEmbedding
from eagle3.draft.shift import shift_left
from eagle3.draft.teacher import TOPK_KEYS, target_to_draft_index, teacher_kind, topk_target_logits

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

PAD_INPUT_ID = 0  # fed where the token to consume lies past the end of a sample


class TargetWeightsError(ValueError):
    pass


def _reindex_after_load(module: Eagle3DraftHead, _incompatible_keys: object) -> None:
    module._index_target_to_draft()


class Eagle3DraftHead(nn.Module):
    d2t: torch.Tensor  # buffers
    t2d: torch.Tensor
    target_to_draft: torch.Tensor

    def __init__(self, cfg: DraftConfig, attention: str = "sdpa"):
        super().__init__()
        self.cfg = cfg
        self.attention = attention  # "sdpa" (dense bool mask, any device) | "flex" (block masks, CUDA)
        h, v, vt = cfg.hidden_size, cfg.draft_vocab_size, cfg.target_vocab_size
        aux = cfg.num_aux_layers * h
        # trainable; the optional norms before fc (config.py NORM_OPTIONS) under the names
        # speculators and vLLM load: input_norm.weight [num_aux*H], fc_norm.{i}.weight [H]
        self.input_norm = RMSNorm(aux, cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.fc_norm = (
            nn.ModuleList([RMSNorm(h, cfg.rms_norm_eps) for _ in range(cfg.num_aux_layers)]) if cfg.fc_norm else None
        )
        self.fc = nn.Linear(aux, h, bias=False)
        self.layers = nn.ModuleList(
            [Eagle3DecoderLayer(cfg)] + [DraftDecoderLayer(cfg) for _ in range(cfg.num_layers - 1)]
        )
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, v, bias=False)
        self.rotary = RotaryEmbedding(cfg)
        # frozen copies of the target's pieces: parameters with requires_grad=False rather
        # than buffers, so DDP does not re-broadcast a vocab-sized matrix every step.
        # NaN until load_target_weights: a forgotten load shows up as a NaN loss at once.
        self.embed_tokens = nn.Embedding(vt, h)
        self.target_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.target_lm_head = nn.Linear(h, v, bias=False)  # target lm_head rows of the draft vocab
        for p in (self.embed_tokens.weight, self.target_norm.weight, self.target_lm_head.weight):
            p.requires_grad_(False)
        self.register_buffer("d2t", torch.zeros(v, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(vt, dtype=torch.bool))
        # [Vt] draft id of each target id (-1: not in the draft vocab), for a top-k teacher: built
        # from d2t whenever d2t is set (load_target_weights, or a state dict: the hook below);
        # never saved, since d2t holds it
        self.register_buffer("target_to_draft", torch.full((vt,), -1, dtype=torch.int64), persistent=False)
        self.register_load_state_dict_post_hook(_reindex_after_load)  # type: ignore[no-untyped-call]  # a module-level function: pickles
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Trainable linears ~ N(0, initializer_range), norms = 1 (HF Llama init)."""
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and not name.startswith("target_"):
                module.weight.normal_(0.0, self.cfg.initializer_range)
            elif isinstance(module, RMSNorm) and not name.startswith("target_"):
                module.weight.fill_(1.0)
        self.embed_tokens.weight.fill_(float("nan"))
        self.target_norm.weight.fill_(float("nan"))
        self.target_lm_head.weight.fill_(float("nan"))

    @torch.no_grad()
    def load_target_weights(
        self,
        embed_tokens: torch.Tensor,  # [Vt, H]
        target_norm_weight: torch.Tensor,  # [H]
        target_lm_head_weight_full: torch.Tensor,  # [Vt, H] (the embeddings if tied)
        d2t: torch.Tensor,  # [V] int64: target_id = draft_id + d2t[draft_id]
        t2d: torch.Tensor,  # [Vt] bool: target id is in the draft vocab
        init_lm_head_from_target: bool,
    ) -> None:
        cfg = self.cfg
        h, v, vt = cfg.hidden_size, cfg.draft_vocab_size, cfg.target_vocab_size
        expect = {
            "embed_tokens": (embed_tokens, (vt, h)),
            "target_norm_weight": (target_norm_weight, (h,)),
            "target_lm_head_weight_full": (target_lm_head_weight_full, (vt, h)),
            "d2t": (d2t, (v,)),
            "t2d": (t2d, (vt,)),
        }
        for name, (tensor, shape) in expect.items():
            if tuple(tensor.shape) != shape:
                raise TargetWeightsError(
                    f"load_target_weights: {name} has shape {tuple(tensor.shape)}, expected {shape} "
                    f"(target vocab {vt}, draft vocab {v}, hidden {h})"
                )
        t2d = t2d.to(torch.bool).cpu()
        d2t = d2t.to(torch.int64).cpu()
        target_ids = torch.arange(v, dtype=torch.int64) + d2t
        if int(t2d.sum()) != v or not torch.equal(target_ids, t2d.nonzero().squeeze(1)):
            raise TargetWeightsError(
                "load_target_weights: d2t and t2d disagree: arange(V) + d2t must list exactly the "
                f"target ids where t2d is True, in increasing order (t2d has {int(t2d.sum())} True, V={v})"
            )
        rows = target_lm_head_weight_full.index_select(0, target_ids.to(target_lm_head_weight_full.device))
        self.embed_tokens.weight.copy_(embed_tokens)
        self.target_norm.weight.copy_(target_norm_weight)
        self.target_lm_head.weight.copy_(rows)
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)
        self._index_target_to_draft()
        if init_lm_head_from_target:
            self.lm_head.weight.copy_(rows)

    @torch.no_grad()
    def target_logits(self, final_hidden: torch.Tensor) -> torch.Tensor:
        """z [B, T, H] -> target logits restricted to the draft vocab [B, T, V] (no grad).

        softmax over these V rows is the target distribution renormalised on the draft vocab.
        """
        z = final_hidden.to(self.target_lm_head.weight.dtype)
        return self.target_lm_head(self.target_norm(z))

    @torch.no_grad()
    def _index_target_to_draft(self) -> None:
        self.target_to_draft.copy_(target_to_draft_index(self.d2t, self.cfg.target_vocab_size))

    @torch.no_grad()
    def teacher_logits(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The teacher on the draft vocab from either kind of batch (eagle3/draft/teacher.py):
        (logits [B, T, V], covered [B, T] bool or None). From `final_hidden`: target_logits, None
        (every row usable). From `teacher_ids`/`teacher_logprobs`: the top-k renormalised over
        top-k ∩ draft vocab, and which rows hold any draft token at all."""
        if teacher_kind(batch) == "final":
            return self.target_logits(batch["final_hidden"]), None
        ids, logprobs = (batch[key] for key in TOPK_KEYS)
        return topk_target_logits(ids, logprobs, self.target_to_draft, self.cfg.draft_vocab_size)

    def forward(
        self,
        aux_hidden: torch.Tensor,  # [B, T, num_aux * H]
        input_ids: torch.Tensor,  # [B, T] int64
        position_ids: torch.Tensor,  # [B, T]: position of x_t within its sample (0-based)
        segment_ids: torch.Tensor,  # [B, T]: packed-sample index per token, -1 = padding
        ttt_steps: int,
    ) -> list[torch.Tensor]:
        """Draft logits per TTT step: a list of ttt_steps tensors [B, T, V] (see module doc)."""
        self._check_inputs(aux_hidden, input_ids, position_ids, segment_ids, ttt_steps)
        masks: list[BlockMask] | list[torch.Tensor]
        if self.attention == "flex":
            masks = build_flex_masks(segment_ids, ttt_steps)
        elif self.attention == "sdpa":
            dense = build_ttt_mask(segment_ids, ttt_steps)
            masks = [ttt_step_mask(dense, k) for k in range(ttt_steps)]
        else:
            raise ValueError(f"Eagle3DraftHead.attention: expected 'sdpa' or 'flex', got {self.attention!r}")
        hidden = self.fc(self._normed_aux(aux_hidden.to(self.fc.weight.dtype)))
        first, *rest = self.layers
        # each layer keeps its own keys/values of the earlier TTT steps
        past: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = [([], []) for _ in self.layers]
        step_logits: list[torch.Tensor] = []
        for step in range(ttt_steps):
            ids, _ = shift_left(input_ids, segment_ids, 1 + step, fill=PAD_INPUT_ID)
            embeds = self.embed_tokens(ids).to(hidden.dtype)
            cos, sin = self.rotary(position_ids + 1 + step, hidden.dtype)
            hidden = first(embeds, hidden, cos, sin, *past[0], masks[step])
            for layer, (keys, values) in zip(rest, past[1:]):
                hidden = layer(hidden, cos, sin, keys, values, masks[step])
            normed = self.norm(hidden)
            if self.cfg.norm_output:  # the next step reads the normed state, as vLLM's next position does
                hidden = normed
            step_logits.append(self.lm_head(normed))
        return step_logits

    def _normed_aux(self, g: torch.Tensor) -> torch.Tensor:
        """The aux features as fc reads them: input_norm over all of them (norm_before_fc) or
        fc_norm[i] over the i-th one (fc_norm); speculators and vLLM apply them in this order."""
        if self.input_norm is not None:
            g = self.input_norm(g)
        if self.fc_norm is not None:
            chunks = g.chunk(len(self.fc_norm), dim=-1)
            g = torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, chunks)], dim=-1)
        return g

    def _check_inputs(
        self,
        aux_hidden: torch.Tensor,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        segment_ids: torch.Tensor,
        ttt_steps: int,
    ) -> None:
        b, t = input_ids.shape
        want_aux = (b, t, self.cfg.num_aux_layers * self.cfg.hidden_size)
        if tuple(aux_hidden.shape) != want_aux:
            raise ValueError(
                f"Eagle3DraftHead.forward: aux_hidden has shape {tuple(aux_hidden.shape)}, expected {want_aux} "
                f"(B, T, num_aux_layers * hidden_size)"
            )
        for name, tensor in (("position_ids", position_ids), ("segment_ids", segment_ids)):
            if tuple(tensor.shape) != (b, t):
                raise ValueError(f"Eagle3DraftHead.forward: {name} has shape {tuple(tensor.shape)}, expected {(b, t)}")
        if ttt_steps < 1:
            raise ValueError(f"Eagle3DraftHead.forward: ttt_steps must be >= 1, got {ttt_steps}")
