"""The head replayed on exactly what vLLM served: its own with-head greedy outputs.

`evaluate` measures acceptance from vLLM's counters. Here the same prompt + output token
sequences go through the target with transformers (hidden states captured as for
training, through the capture adapter), and the exported head replays serving's drafting
rounds on them (eagle3/draft/replay.py). Same tokens, same rounds: the two figures differ
only by numerics (vLLM's batched bf16 kernels against a transformers forward), so a gap
beyond a few hundredths means the harness, the export or the replay is wrong. Unlike the
dataset replay, this needs no shards on this machine and covers every prompt source.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eagle3.draft.loss import StepCounts
from eagle3.evaluation.diagnostics.head_replay import add_batch, figures, load_exported_head, replay_device
from eagle3.store.packing import collate_packed
from eagle3.target_model.capture_hf import HFCaptureBackend
from eagle3.target_model.resolve import read_hf_config

ALL = "all"


@torch.no_grad()
def replay_served(
    export_dir: str | Path,
    target: str,
    served: dict[str, list[tuple[list[int], list[int]]]],
    *,
    num_draft_tokens: int,
    max_answer_tokens: int,
) -> tuple[dict[str, dict[str, float]], str | None]:
    """({source: figures, "all": figures}, None), or ({}, why it was skipped). ``served`` maps a
    prompt source to its (prompt ids, with-head output ids) pairs."""
    pairs = {s: [(p, o) for p, o in v if o] for s, v in served.items()}
    if not any(pairs.values()):
        return {}, None
    device, note = replay_device(target, "replay of the served outputs")
    if device is None:
        return {}, note
    head, aux_layer_ids = load_exported_head(export_dir, target)
    head = head.to(device)
    num_layers = int(read_hf_config(target)["num_hidden_layers"])  # id N: the final state before the norm
    backend = HFCaptureBackend(str(target), [*aux_layer_ids, num_layers], dtype=torch.bfloat16, device=device)
    empty = (StepCounts.zeros(num_draft_tokens), torch.zeros(2 + num_draft_tokens, dtype=torch.float64))
    total, out = empty, {}
    try:
        for source, seqs in pairs.items():
            samples = []
            for i, (prompt, output) in enumerate(seqs):
                ids = torch.tensor([*prompt, *output], dtype=torch.int64)
                mask = torch.zeros(len(ids), dtype=torch.bool)
                mask[len(prompt) :] = True  # the served answer: what the head drafted for
                samples.append((f"{source}-{i}", ids, mask))
            acc = empty
            for rec in backend.capture(samples):
                batch = collate_packed(
                    [{"input_ids": rec.token_ids, "loss_mask": rec.loss_mask, "hidden": rec.states()}], rec.num_tokens
                )
                acc = add_batch(
                    head,
                    batch,
                    *acc,
                    num_draft_tokens=num_draft_tokens,
                    max_answer_tokens=max_answer_tokens,
                    first_span_only=True,
                    device=device,
                )
            out[source] = figures(*acc, num_draft_tokens, len(samples))
            total = (total[0] + acc[0], total[1] + acc[1])
    finally:
        backend.close()
    out[ALL] = figures(*total, num_draft_tokens, sum(len(v) for v in pairs.values()))
    return out, None
