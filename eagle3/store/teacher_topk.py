"""The teacher's top-k (``capture.teacher_topk``): what a shard stores in place of the final layer.

The trainer turns the final state z_t (vLLM id N, before the final norm) into the teacher's
distribution p_t = softmax(lm_head(norm(z_t))). That state is H values a token (1,152 of SmolLM2's
2,895 fp8 bytes); k ids and log-probabilities are k x 6 bytes. With k set, a shard holds

    teacher_ids       int32   [T, k]  the target-vocab ids of the k largest logits, most likely first
    teacher_logprobs  float16 [T, k]  their log-probabilities: log_softmax over the FULL target
                                      vocab in fp32 (their sum of exp says how much mass the k hold)

The projection is the target's own: RMSNorm with its weight and eps, as Llama and vLLM compute it
(fp32 statistics, the product in the states' dtype), then lm_head (the embeddings when tied) and
log_softmax, both in fp32. It runs in chunks of ``chunk_tokens`` tokens, so the
[chunk, Vt] fp32 logits stay small (Llama-3's 128k vocab: 0.5 GiB a 1,024-token chunk), on the
device that holds the weights: a GPU capture's device, or the host (the writer threads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IDS_DTYPE, LOGPROBS_DTYPE = torch.int32, torch.float16
TEACHER_TENSORS = ("teacher_ids", "teacher_logprobs")


@dataclass(frozen=True)
class TeacherProjection:
    """The target's final norm and lm_head, and how many of its next tokens a shard keeps."""

    norm_weight: torch.Tensor  # [H]
    eps: float
    lm_head: torch.Tensor  # [Vt, H], on the device the math runs on
    k: int
    chunk_tokens: int = 1024
    vocab_block: int = 16384  # lm_head rows upcast to fp32 at once

    def __post_init__(self) -> None:
        V, H = (int(d) for d in self.lm_head.shape) if self.lm_head.dim() == 2 else (-1, -1)
        if H < 1 or list(self.norm_weight.shape) != [H]:
            raise ValueError(
                f"TeacherProjection: expected lm_head [Vt, H] and norm_weight [H], got "
                f"{list(self.lm_head.shape)} and {list(self.norm_weight.shape)}"
            )
        check_k(self.k, V)
        if not self.eps > 0:
            raise ValueError(f"TeacherProjection.eps: expected the target's rms_norm_eps > 0, got {self.eps}")
        if self.chunk_tokens < 1 or self.vocab_block < 1:
            raise ValueError(
                f"TeacherProjection chunk_tokens, vocab_block: expected >= 1, got {self.chunk_tokens}, {self.vocab_block}"
            )

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.shape[0])

    @property
    def device(self) -> torch.device:
        return self.lm_head.device

    def to(self, device: torch.device | str) -> "TeacherProjection":
        """The same projection with its weights on ``device`` (a copy only when they are elsewhere)."""
        d = torch.device(device)
        if self.device == d:
            return self
        w = (self.norm_weight.to(d), self.eps, self.lm_head.to(d), self.k)
        return TeacherProjection(*w, chunk_tokens=self.chunk_tokens, vocab_block=self.vocab_block)

    @torch.inference_mode()
    def topk(self, final: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """final [..., H] (any device) -> (ids int32 [..., k], logprobs float16 [..., k]) on
        final's device, computed on the weights' device, ids in decreasing order of probability."""
        *lead, H = final.shape
        if H != self.lm_head.shape[1]:
            raise ValueError(f"TeacherProjection.topk: expected final states [..., {self.lm_head.shape[1]}], got {H}")
        rows = final.reshape(-1, H)  # [N, H]
        ids = torch.empty((rows.shape[0], self.k), dtype=IDS_DTYPE, device=final.device)  # [N, k]
        logprobs = torch.empty((rows.shape[0], self.k), dtype=LOGPROBS_DTYPE, device=final.device)  # [N, k]
        for a in range(0, rows.shape[0], self.chunk_tokens):
            z = rows[a : a + self.chunk_tokens].to(self.device)  # [n, H] in the capture dtype
            top, idx = torch.topk(self.logprobs(z), self.k, dim=-1, sorted=True)  # [n, k] each
            ids[a : a + z.shape[0]] = idx.to(final.device)
            logprobs[a : a + z.shape[0]] = top.to(final.device)
        return ids.reshape(*lead, self.k), logprobs.reshape(*lead, self.k)

    def logprobs(self, z: torch.Tensor) -> torch.Tensor:
        """z [n, H] -> float32 [n, Vt]: log_softmax(lm_head(norm(z))) over the whole vocab."""
        z32 = z.float()  # [n, H]
        normed = z32 * torch.rsqrt(z32.pow(2).mean(-1, keepdim=True) + self.eps)  # [n, H]
        product = self.norm_weight * normed.to(z.dtype)  # [n, H]: Llama's RMSNorm, product in z's dtype
        if _tensor_core_logits(product, self.lm_head):
            # on a GPU: the bf16 values multiplied exactly and summed in fp32 on the tensor cores, the
            # fp32 matmul's logits up to the order of the sum at several times its speed (Llama-3.1-8B:
            # 4,096 x 128,256 multiply-adds a token)
            return torch.log_softmax(torch.mm(product, self.lm_head.T, out_dtype=torch.float32), dim=-1)  # [n, Vt]
        normed = product.float()  # [n, H]
        # the logits in fp32, lm_head upcast a block of rows at a time (no fp32 copy of it kept):
        # bf16 logits step by 1/16 at SmolLM2's magnitudes, and their ties and rounding moved the
        # top-1 off the fp32 argmax on 2.4% of a real capture's tokens
        logits = torch.empty((z.shape[0], self.vocab_size), dtype=torch.float32, device=z.device)  # [n, Vt]
        for a in range(0, self.vocab_size, self.vocab_block):
            rows = self.lm_head[a : a + self.vocab_block].float()  # [Vb, H]
            torch.matmul(normed, rows.T, out=logits[:, a : a + rows.shape[0]])
        return torch.log_softmax(logits, dim=-1)  # [n, Vt]


def check_k(k: int | None, vocab_size: int, key: str = "capture.teacher_topk") -> int:
    """k as an int when 1 <= k <= the target's vocabulary, else a ValueError naming ``key``."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= int(vocab_size):
        raise ValueError(f"{key}: expected an integer in 1..{vocab_size} (the target's vocabulary), got {k!r}")
    return int(k)


def _tensor_core_logits(normed: torch.Tensor, lm_head: torch.Tensor) -> bool:
    """Whether torch.mm gives fp32 logits from these half-precision operands directly (CUDA only)."""
    return normed.is_cuda and normed.dtype in (torch.bfloat16, torch.float16) and lm_head.dtype == normed.dtype
