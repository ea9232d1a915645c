"""A dataset of stored hidden states, written: the samples rendered (and answered again by the
target when data.regenerate), this node's part of them captured by the backend the capture
group names, the shards and the draft vocabulary written, holding the dataset's lock.

Resumable: samples already in valid shards are skipped. A repair (damaged shards of a complete
dataset) captures only the samples those shards held, with no deadline. A disk that fills up
mid-run stops it with the bytes still needed; the shards written so far are kept. Under a time
budget the dataset is finished with the samples done by its deadlines (``budget_cut``)."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import torch
from rich.console import Console

from eagle3.data.pipeline import PreparedData, PreparedSample
from eagle3.data.split import interleaved
from eagle3.data.vocab import build_draft_vocab, token_frequencies
from eagle3.extraction.capture_loop import capture_into, manifest_capture_route
from eagle3.extraction.identity import budget_cut, check_regen_engine, mixture_counts, provenance
from eagle3.extraction.job import CaptureSetup, ExtractionJob, ExtractionTiming
from eagle3.extraction.samples import prepare, regenerator_for
from eagle3.store import DiskSpaceError, Manifest, ShardWriter, check_free_disk, disk_needed_bytes, format_bytes
from eagle3.store.disk import free_bytes
from eagle3.store.merge import owner_shard
from eagle3.store.provenance import with_capture
from eagle3.store.storage_format import StorageFormat
from eagle3.store.teacher_topk import TeacherProjection
from eagle3.store.write_options import ExistingShards, WriteOptions
from eagle3.target_model.backend import CaptureBackend, make_backend
from eagle3.target_model.capture_hf import HFCaptureBackend
from eagle3.target_model.records import DeviceEncoding
from eagle3.target_model.teacher_weights import weights_from_files, weights_from_model
from eagle3.util.locks import DirLock
from eagle3.util.report import minutes, report

console = Console(stderr=True)
# provenance key: the rates this extraction measured (a time budget on this machine plans from them next)
MEASURED_RATES = "measured_rates"
# fewer samples than this measure their warm-up (the first forward, the first batch), not a rate, and
# a plan divided by it would give capture minutes it never needs (docs/records/2026-12-07-polish-gpu-first.md)
MIN_RATE_SAMPLES = 16


def extract_dataset(job: ExtractionJob, setup: CaptureSetup, timing: ExtractionTiming, lock: DirLock) -> Manifest:
    """Regenerate, render, capture and write ``job``'s dataset, holding its ``lock``."""
    measured: dict[str, float] = {}  # this machine's rates, as this run saw them (provenance.measured_rates)
    data, engine = _render(job, setup, timing, measured)
    samples, val_ids = _select(job, data)
    writer = _open_writer(job, setup, engine, lock)
    try:
        todo = _todo(job, setup, writer, samples)
        try:
            cut = _capture(job, setup, timing, writer, todo, measured) if todo else None
            if data.report.deadline_stop is not None or cut is not None:
                # the samples done in time make the dataset
                samples, val_ids = _keep_done(job, writer, samples, val_ids, data.report.deadline_stop, cut)
            manifest = _finish(job, setup, timing, writer, samples, val_ids, measured)
        except DiskSpaceError as e:  # the disk filled up during the run (another job, a bad estimate)
            # from None: the message holds e's; chained, the traceback printed it again without the advice
            raise DiskSpaceError(_disk_full_message(e, job, setup, todo, writer)) from None
    finally:
        writer.close()
    console.print(
        f"[green]done: {manifest.num_samples} samples, {manifest.num_tokens} tokens "
        f"({manifest.num_loss_tokens} loss tokens) in {len(manifest.shards)} shards"
    )
    return manifest


def _render(
    job: ExtractionJob, setup: CaptureSetup, timing: ExtractionTiming, measured: dict[str, float]
) -> tuple[PreparedData, str | None]:
    """The config's samples, and the engine that answered them (None: the chat data's own). A
    repair changes only what was damaged: the dataset keeps its samples, validation ids, counts
    and budget cut, whichever node's command (a merged dataset) or time budget runs it; only the
    samples it holds are answered, with no deadline."""
    from transformers import AutoTokenizer

    identity, dataset_dir = job.identity, job.found.dataset_dir
    tokenizer = AutoTokenizer.from_pretrained(identity.target_dir, trust_remote_code=identity.model.trust_remote_code)
    repair = Manifest.read(dataset_dir) if job.repair else None
    regenerator = regenerator_for(identity, setup.regen)
    engine = regenerator.backend if regenerator is not None else None
    check_regen_engine(dataset_dir, engine)  # before any answer is generated
    if repair is not None and regenerator is not None:
        regenerator.restrict_to(repair.sample_ids)
    regen_deadline = None if repair is not None else timing.regen_deadline
    data = prepare(
        identity.data, tokenizer, regenerator, chat_template=identity.model.chat_template, regen_deadline=regen_deadline
    )
    if regenerator is not None:
        measured.update(_regen_rates(regenerator, data))
    return data, engine


def _regen_rates(regenerator, data: PreparedData) -> dict[str, float]:
    """The regeneration's new tokens per second and engine start, when this run answered every
    conversation itself (answers from the cache would flatter the rate: nothing then); the rate
    only over MIN_RATE_SAMPLES conversations or more."""
    report = data.report
    if not regenerator.generated or regenerator.seeded_turns or report.regen_seconds <= 0:
        return {}
    if regenerator.generated < report.conversations_rendered:  # some came from the cache
        return {}
    out = {}
    if regenerator.generated >= MIN_RATE_SAMPLES:
        out["regen_tok_s"] = regenerator.new_tokens / report.regen_seconds
    if report.regen_engine_start_s > 0:
        out["regen_start_s"] = report.regen_engine_start_s
    return out


def _select(job: ExtractionJob, data: PreparedData) -> tuple[list[PreparedSample], list[str]]:
    """The samples this run writes (validation ones spread through the capture order, so a cut
    keeps the split's proportions) and its validation ids: a repair's as its manifest lists
    them, otherwise this node's part."""
    if job.repair:
        repair = Manifest.read(job.found.dataset_dir)
        listed = set(repair.sample_ids)
        return [s for s in interleaved(data.train, data.val) if s.id in listed], list(repair.val_ids)
    n, index = job.num_shards, job.shard_index
    samples = [s for s in interleaved(data.train, data.val) if n == 1 or owner_shard(s.id, n) == index]
    kept = {s.id for s in samples}
    return samples, sorted(s.id for s in data.val if s.id in kept)


def _open_writer(job: ExtractionJob, setup: CaptureSetup, engine: str | None, lock: DirLock) -> ShardWriter:
    found = job.found
    return ShardWriter(
        found.dataset_dir,
        layer_ids=list(job.identity.layer_ids),
        hidden_size=job.identity.model.hidden_size,
        dtype=setup.dtype,
        fingerprint_inputs=job.inputs,
        write=WriteOptions(
            shard_max_tokens=setup.capture.shard_max_tokens,
            background=True,  # shards hash+write on threads while the next batch runs
            writer_threads=setup.capture.writer_threads,
            encode_device=_writer_encode_device(setup),
        ),
        # the shards found damaged are redone; the others were just checked
        existing=ExistingShards("fast" if found.damaged else found.verify, [file for file, _ in found.damaged]),
        provenance=provenance(job.identity, engine),
        lock=lock,
        storage=job.identity.storage,
    )


def _writer_encode_device(setup: CaptureSetup) -> str | None:
    """Where the writer threads encode states that reach the host as captured (vLLM's files; the
    HF capture on a GPU hands them over encoded): the GPU of a GPU topology, else the host."""
    return "cuda" if str(setup.topology.accelerator) == "gpu" and torch.cuda.is_available() else None


def _disk_need(job: ExtractionJob, setup: CaptureSetup, samples: list[PreparedSample]) -> tuple[int, int]:
    """(tokens, bytes on disk) of capturing ``samples``."""
    tokens = sum(int(s.input_ids.numel()) for s in samples)
    hidden = job.identity.model.hidden_size
    layers = len(job.identity.layer_ids)
    shard = setup.capture.shard_max_tokens
    return tokens, disk_needed_bytes(tokens, layers, hidden, setup.dtype, len(samples), shard, job.identity.storage)


def _todo(
    job: ExtractionJob, setup: CaptureSetup, writer: ShardWriter, samples: list[PreparedSample]
) -> list[PreparedSample]:
    """The samples not yet in a valid shard, once the disk was found to hold them."""
    damaged = dict(job.found.damaged)
    for file, why in writer.dropped:
        if file not in damaged:  # those were reported when found
            console.print(f"[yellow]{file}: {why}; its samples will be captured again")
    done_ids = writer.done_ids()
    todo = [s for s in samples if s.id not in done_ids]
    todo_tokens, need = _disk_need(job, setup, todo)
    dataset_dir = job.found.dataset_dir
    free = check_free_disk(dataset_dir, need, setup.capture.disk_margin)
    console.print(
        f"dataset {dataset_dir}\n  {len(samples)} samples ({len(done_ids)} already done), {todo_tokens} tokens to "
        f"capture x {len(job.identity.layer_ids)} layers x {job.identity.model.hidden_size} x {setup.dtype} "
        f"(stored {job.identity.storage}): needs "
        f"{format_bytes(need)}, free {format_bytes(free)}"
    )
    return todo


def _device_encoding(storage: StorageFormat, teacher: TeacherProjection | None = None) -> DeviceEncoding | None:
    """The format's encode for a capture on a GPU to run there (the store's math: the bytes are
    those the writer threads would write), with the teacher's top-k when ``teacher`` (a format with
    the top-k encodes nothing until it is given); None for exact states."""
    return None if storage.is_exact else DeviceEncoding(storage, partial(storage.encode, teacher=teacher))


def _teach(backend: CaptureBackend, storage: StorageFormat, target_dir: str, writer: ShardWriter) -> None:
    """capture.teacher_topk: the target's projection handed to the writer (whose threads encode
    the captured states that reach the host) and, for the HF capture on a GPU, to its device encode.
    The HF capture's model in memory gives the weights; the vLLM route's are read from the
    directory vLLM serves, onto the GPU when there is one (the projection runs there)."""
    k = storage.teacher_topk
    if k is None:
        return
    if isinstance(backend, HFCaptureBackend):
        assert backend.model is not None  # open until close()
        weights = weights_from_model(backend.model, target_dir)
    else:
        weights = weights_from_files(target_dir, "cuda" if torch.cuda.is_available() else "cpu")
    try:
        teacher = TeacherProjection(*weights, k=k)
    except ValueError as e:
        raise ValueError(f"{e} ({target_dir})") from None
    writer.set_teacher(teacher)
    if isinstance(backend, HFCaptureBackend) and backend.device.type == "cuda":
        backend.device_encoding = _device_encoding(storage, teacher)  # the top-k on the device


def _capture(
    job: ExtractionJob,
    setup: CaptureSetup,
    timing: ExtractionTiming,
    writer: ShardWriter,
    todo: list[PreparedSample],
    measured: dict[str, float],
) -> str | None:
    """Capture ``todo`` into ``writer``; why a time budget stopped it (None: all captured)."""
    todo_tokens = sum(int(s.input_ids.numel()) for s in todo)
    secs = timing.capture_estimate(todo_tokens)
    if secs is not None:
        report([f"extract: {todo_tokens:,} tokens to capture (rendered): ~{minutes(secs)}"])
    identity = job.identity
    backend = make_backend(
        setup.capture,
        setup.topology,
        identity.target_dir,
        list(identity.layer_ids),
        setup.dtype,
        identity.data.max_length,
        trust_remote_code=identity.model.trust_remote_code,
        device_encoding=_device_encoding(identity.storage),
        quantization=identity.model.quantization,
    )
    try:
        _teach(backend, identity.storage, identity.target_dir, writer)
        # every run that captures is kept (provenance.captures): a dataset resumed or repaired under
        # another backend says each route its samples came from
        run = "repair" if job.repair else ("resume" if writer.done_ids() else "extract")
        route = manifest_capture_route(setup.capture.backend.value, backend)
        writer.record_provenance(with_capture(writer.manifest.provenance, route, run))
        # a repair captures every sample it lost: no deadline
        deadline = None if job.repair else timing.capture_deadline(len(todo))
        prompts = [(s.id, s.input_ids, s.loss_mask) for s in todo]
        started = time.monotonic()
        outcome = capture_into(backend, prompts, writer, deadline)
        writer.flush()  # the shards written: what a budget's capture share pays for
        done = set(writer.done_ids())
        captured = [s for s in todo if s.id in done]
        tokens = sum(int(s.input_ids.numel()) for s in captured)
        if tokens and not job.repair and len(captured) >= MIN_RATE_SAMPLES:
            measured["capture_tok_s"] = tokens / max(1e-6, time.monotonic() - started)
        return outcome.cut
    finally:
        backend.close()


def _keep_done(
    job: ExtractionJob,
    writer: ShardWriter,
    samples: list[PreparedSample],
    val_ids: list[str],
    regeneration_cut: str | None,
    capture_cut: str | None,
) -> tuple[list[PreparedSample], list[str]]:
    """The samples (and validation ids) written by a time budget's deadlines; the cut recorded."""
    writer.flush()  # the queued ones are durable, then counted
    done_ids = writer.done_ids()
    kept = [s for s in samples if s.id in done_ids]
    cut = budget_cut(
        job.identity.data.max_samples, len(samples), len(kept), regeneration=regeneration_cut, capture=capture_cut
    )
    writer.record_provenance({"budget_cut": cut})
    return kept, [i for i in val_ids if i in done_ids]


def _finish(
    job: ExtractionJob,
    setup: CaptureSetup,
    timing: ExtractionTiming,
    writer: ShardWriter,
    samples: list[PreparedSample],
    val_ids: list[str],
    measured: dict[str, float],
) -> Manifest:
    """The token frequencies and draft vocabulary of ``samples``, and the manifest: complete."""
    model = job.identity.model
    freq = token_frequencies(samples, model.vocab_size)
    size = min(setup.draft_vocab_size, model.vocab_size)
    # this run's wall time, added to an earlier run's (a repair): what a time budget counts
    seconds = float(writer.manifest.provenance.get("extract_seconds", 0.0)) + timing.clock.seconds()
    vocabs = {size: build_draft_vocab(freq, size)}
    counts = mixture_counts(job.identity.data, samples, val_ids)  # per source, of the samples kept
    rates = {MEASURED_RATES: {k: round(v, 2) for k, v in measured.items()}} if measured else {}
    return writer.finish(
        freq, vocabs, val_ids=val_ids, provenance={"extract_seconds": round(seconds, 1), **counts, **rates}
    )


def _disk_full_message(
    e: DiskSpaceError, job: ExtractionJob, setup: CaptureSetup, todo: list[PreparedSample], writer: ShardWriter
) -> str:
    dataset_dir: Path = job.found.dataset_dir
    done = writer.done_ids()
    left = [s for s in todo if s.id not in done]
    _, need = _disk_need(job, setup, left)
    return (
        f"{e}\n  {dataset_dir}: {len(left)} samples are still to be written: about {format_bytes(need)} ({need} bytes) "
        f"more, {format_bytes(free_bytes(dataset_dir))} free now. The {len(done)} samples already written are kept "
        "(nothing half-written is listed): free space, then re-run the same command to resume"
    )
