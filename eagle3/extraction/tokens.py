"""The pre-pass of online training: the config's samples, split and draft vocabulary written
as a token-only dataset (eagle3/store/token_samples.py). Regeneration happens here, once,
as for a stored dataset; the hidden states are left to the trainer's target."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from eagle3.data.vocab import build_draft_vocab, token_frequencies
from eagle3.extraction.identity import (
    DatasetIdentity,
    budget_cut,
    mixture_counts,
    provenance,
    token_dataset_path,
    token_fingerprint_inputs,
)
from eagle3.extraction.samples import RegenMachine, prepare, regenerator_for
from eagle3.store import Manifest, format_bytes, write_token_dataset
from eagle3.store.layout import LOCK
from eagle3.store.vocab_files import DraftVocabs
from eagle3.util.clock import Deadline, StageClock
from eagle3.util.hidden_dtypes import torch_dtype
from eagle3.util.locks import DirLock, lock_wait_s

console = Console(stderr=True)


def prepare_token_dataset(
    identity: DatasetIdentity,
    machine: RegenMachine,
    draft_vocab_size: int,
    clock: StageClock | None = None,
    regen_deadline: Deadline | None = None,
) -> Path:
    """The online dataset of this identity: found complete, or written now (a few seconds per
    thousand samples without regeneration), with a draft vocabulary of ``draft_vocab_size``
    (at most the target's). ``clock``: the calling stage's (its seconds are recorded; default:
    from this call); ``regen_deadline``: a time budget's end of regeneration. Returns its directory."""
    clock = clock or StageClock()
    inputs = token_fingerprint_inputs(identity)  # hashes the model and chat data: once
    dataset_dir = token_dataset_path(identity, inputs)
    if Manifest.read_complete(dataset_dir) is None:
        # one writer; the others (DDP ranks started together) wait for it and then read its dataset
        dataset_dir.mkdir(parents=True, exist_ok=True)
        with DirLock(
            dataset_dir / LOCK, f"{dataset_dir}: the online dataset is being written", wait_s=lock_wait_s()
        ) as lock:
            if Manifest.read_complete(dataset_dir) is None:
                _write(identity, machine, draft_vocab_size, dataset_dir, inputs, lock, clock, regen_deadline)
                return dataset_dir
    done = Manifest.read_complete(dataset_dir)
    assert done is not None  # written above, or by the rank that held the lock before
    console.print(f"online dataset {dataset_dir}: {done.num_samples} samples, {done.num_tokens} tokens")
    return dataset_dir


def _write(
    identity: DatasetIdentity,
    machine: RegenMachine,
    draft_vocab_size: int,
    dataset_dir: Path,
    inputs: dict,
    lock: DirLock,
    clock: StageClock,
    regen_deadline: Deadline | None,
) -> None:
    from transformers import AutoTokenizer

    model = identity.model
    tokenizer = AutoTokenizer.from_pretrained(identity.target_dir, trust_remote_code=model.trust_remote_code)
    regenerator = regenerator_for(identity, machine)
    engine = regenerator.backend if regenerator is not None else None
    data = prepare(
        identity.data, tokenizer, regenerator, chat_template=model.chat_template, regen_deadline=regen_deadline
    )
    samples = data.train + data.val
    cut = data.report.deadline_stop
    # a time budget that stopped regeneration early (the dataset has what was answered in time)
    rendered = len(samples)
    cut_note = (
        {"budget_cut": budget_cut(identity.data.max_samples, rendered, rendered, regeneration=cut)} if cut else {}
    )
    freq = token_frequencies(samples, model.vocab_size)
    size = min(draft_vocab_size, model.vocab_size)
    manifest = write_token_dataset(
        dataset_dir,
        [(s.id, s.input_ids, s.loss_mask) for s in samples],
        val_ids=[s.id for s in data.val],
        fingerprint_inputs=inputs,
        layer_ids=list(identity.layer_ids),
        hidden_size=model.hidden_size,
        dtype=torch_dtype(identity.capture_dtype),
        vocab=DraftVocabs(freq, {size: build_draft_vocab(freq, size)}),
        # its wall time: what a time budget counts
        provenance={
            **provenance(identity, engine),
            **cut_note,
            **mixture_counts(identity.data, samples, [s.id for s in data.val]),
            "extract_seconds": round(clock.seconds(), 1),
        },
        lock=lock,
    )
    stored = (
        manifest.num_tokens
        * len(manifest.layer_ids)
        * manifest.hidden_size
        * torch_dtype(identity.capture_dtype).itemsize
    )
    console.print(
        f"[green]online dataset {dataset_dir}: {manifest.num_samples} samples, {manifest.num_tokens} tokens "
        f"({manifest.num_loss_tokens} loss tokens); {format_bytes(manifest.shards[0].size_bytes)} on disk "
        f"instead of {format_bytes(stored)} of hidden states"
    )
