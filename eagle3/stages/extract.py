"""extract.py's stage: render chat data, capture hidden states, write the dataset.

Resumable: samples already in valid shards are skipped, so a killed run continues where
it stopped. A finished dataset is checked first (every shard's size and header; its sha256
too with capture.verify=full): a missing, short or corrupt shard is captured again from the
samples the manifest lists for it, in place, and only it; a whole one makes a re-run a no-op
that says so. A disk that fills up mid-run stops it with the bytes still needed; the shards
written so far are kept and the same command resumes.

Under ``time_budget.minutes`` regeneration and capture each stop at the end of their share of
the plan (eagle3/stages/time_budget.py): the dataset is finished with the samples done by then,
validation samples spread through the capture order so a cut keeps the split's proportions, and
its provenance records the cut (``budget_cut``).
"""

from __future__ import annotations

import time
from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from eagle3.config.schema import HiddenStates, RunConfig, VerifyMode, run_config
from eagle3.data.split import interleaved
from eagle3.data.vocab import build_draft_vocab, token_frequencies
from eagle3.extraction.identity import (
    DatasetRecipe,
    budget_cut,
    check_regen_engine,
    dataset_path,
    fingerprint_inputs,
    legacy_dataset_path,
    provenance,
    regen_note,
)
from eagle3.extraction.samples import prepare, regenerator_for
from eagle3.stages import time_budget
from eagle3.stages.cost import capture_seconds, extract_lines
from eagle3.stages.recipes import dataset_recipe, regen_machine
from eagle3.stages.validate import config_torch_dtype, validate_run_config
from eagle3.store import DiskSpaceError, Manifest, ShardWriter, check_free_disk, disk_needed_bytes, format_bytes
from eagle3.store.disk import free_bytes
from eagle3.store.layout import LOCK
from eagle3.store.merge import merge_parts, owner_shard, part_dir
from eagle3.store.reader import damaged_shards
from eagle3.target_model.backend import CaptureBackend, make_backend
from eagle3.target_model.resolve import resolve_target
from eagle3.util.clock import Deadline, StageClock
from eagle3.util.faults import fault
from eagle3.util.launch import extraction_shard
from eagle3.util.locks import DirLock
from eagle3.util.report import minutes, report

console = Console(stderr=True)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]capture"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("samples"),
        TextColumn("{task.fields[tok_s]:>8.0f} tok/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
    )


def run(composed: DictConfig) -> str:
    """``composed``: the config as composed; validated, then converted once to the RunConfig
    that everything below takes."""
    clock = StageClock()  # what this run costs: provenance.extract_seconds
    validate_run_config(composed)
    # time_budget.minutes: the data sized to the budget's plan (train.py makes the same)
    cfg, split = time_budget.sized(run_config(composed))
    if split is not None:
        report(split.lines())
    model_dir = resolve_target(cfg.model, cfg.paths.cache_dir)
    recipe = dataset_recipe(cfg, model_dir)
    if cfg.train.hidden_states == HiddenStates.online:
        # the pre-pass of online training: samples and vocabulary, no hidden states
        from eagle3.extraction.tokens import prepare_token_dataset

        ds_dir = prepare_token_dataset(
            recipe, regen_machine(cfg), cfg.train.draft_vocab_size, clock, time_budget.regen_deadline(split, clock)
        )
        print(ds_dir)
        return str(ds_dir)
    inputs = fingerprint_inputs(recipe)
    ds_dir = dataset_path(recipe)
    # shard_index/num_shards, or srun's task rank when it started several extract processes
    num_shards, shard_index = extraction_shard(cfg.num_shards, cfg.shard_index)
    if cfg.merge:
        return _merge(cfg, ds_dir, num_shards)
    done = Manifest.read_complete(ds_dir)
    if done is None and Manifest.read_complete(old := legacy_dataset_path(recipe)) is not None:
        ds_dir, done = old, Manifest.read_complete(old)  # this config's dataset, named by the first scheme
    if num_shards > 1 and done is None:
        # this node's part of a multi-node extraction, merged afterwards (eagle3/store/merge.py)
        ds_dir = part_dir(ds_dir, shard_index, num_shards)
        done = Manifest.read_complete(ds_dir)
    verify = cfg.capture.verify.value
    damaged = damaged_shards(ds_dir, done, verify) if done is not None else []
    for file, why in damaged:
        console.print(f"[yellow]repairing {file} (its samples are captured again): {why}")
    if done is not None and not damaged:
        checked = "size, header, sha256" if verify == VerifyMode.full.value else "size, header"
        cut = done.provenance.get("budget_cut")
        cut_note = f"; cut short by a time budget at {cut['samples']} of {cut['rendered_samples']}" if cut else ""
        console.print(
            f"dataset already complete ({done.num_samples} samples{cut_note}, {done.num_tokens} tokens, "
            f"{regen_note(done)}; every shard checked: {checked}): nothing to do"
        )
        print(ds_dir)
        return str(ds_dir)
    # one extraction per dataset, from here on: a second is refused at once, naming this one
    with DirLock(ds_dir / LOCK, f"{ds_dir}: another extraction is writing this dataset") as lock:
        return _extract(cfg, recipe, inputs, ds_dir, num_shards, shard_index, verify, damaged, lock, clock, split)


def _extract(
    cfg: RunConfig,
    recipe: DatasetRecipe,
    inputs: dict,
    ds_dir: Path,
    num_shards: int,
    shard_index: int,
    verify: str,
    damaged: list[tuple[str, str]],
    lock: DirLock,
    clock: StageClock,
    split: time_budget.TimeShares | None,
) -> str:
    """Regenerate, render, capture and write the dataset, holding its lock. ``split``: the time
    budget's plan, whose shares end regeneration and capture (None: no budget)."""
    from transformers import AutoTokenizer

    report(extract_lines(cfg))  # what this run will cost, before any work

    model_dir = recipe.model_dir
    layer_ids = list(recipe.layer_ids)
    dtype = config_torch_dtype(cfg.capture.dtype)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=cfg.model.trust_remote_code)
    # a repair (damaged shards of a complete dataset) changes only what was damaged: the dataset
    # keeps its samples, validation ids, counts and budget cut, whichever node's command (a merged
    # dataset) or time budget runs it; only the samples it holds are answered, with no deadline
    repair = Manifest.read(ds_dir) if damaged else None
    regenerator = regenerator_for(recipe, regen_machine(cfg))
    engine = regenerator.backend if regenerator is not None else None
    check_regen_engine(ds_dir, engine)  # before any answer is generated
    if repair is not None and regenerator is not None:
        regenerator.restrict_to(repair.sample_ids)
    regen_deadline = None if repair is not None else time_budget.regen_deadline(split, clock)
    data = prepare(
        cfg.data, tokenizer, regenerator, chat_template=cfg.model.chat_template, regen_deadline=regen_deadline
    )
    if repair is not None:
        listed = set(repair.sample_ids)
        samples = [s for s in interleaved(data.train, data.val) if s.id in listed]
        val_ids = list(repair.val_ids)
    else:
        samples = [
            s
            for s in interleaved(data.train, data.val)
            if num_shards == 1 or owner_shard(s.id, num_shards) == shard_index
        ]
        kept = {s.id for s in samples}
        val_ids = sorted(s.id for s in data.val if s.id in kept)

    writer = ShardWriter(
        ds_dir,
        layer_ids=layer_ids,
        hidden_size=cfg.model.hidden_size,
        dtype=dtype,
        fingerprint_inputs=inputs,
        shard_max_tokens=cfg.capture.shard_max_tokens,
        background=True,  # shards hash+write on threads while the next batch runs
        writer_threads=cfg.capture.writer_threads,
        provenance=provenance(recipe, engine),
        # the shards found damaged above are redone; the others were just checked
        verify="fast" if damaged else verify,
        redo=[file for file, _ in damaged],
        lock=lock,
    )
    try:
        for file, why in writer.dropped:
            if file not in dict(damaged):  # those were reported above
                console.print(f"[yellow]{file}: {why}; its samples will be captured again")
        done_ids = writer.done_ids()
        todo = [s for s in samples if s.id not in done_ids]
        todo_tokens = sum(int(s.input_ids.numel()) for s in todo)
        need = disk_needed_bytes(
            todo_tokens,
            len(layer_ids),
            cfg.model.hidden_size,
            dtype,
            len(todo),
            cfg.capture.shard_max_tokens,
        )
        free = check_free_disk(ds_dir, need, cfg.capture.disk_margin)
        console.print(
            f"dataset {ds_dir}\n  {len(samples)} samples ({len(done_ids)} already done), {todo_tokens} tokens to "
            f"capture x {len(layer_ids)} layers x {cfg.model.hidden_size} x {dtype}: needs {format_bytes(need)}, "
            f"free {format_bytes(free)}"
        )
        capture_cut: str | None = None  # why the time budget stopped the capture, if it did
        secs = capture_seconds(cfg, todo_tokens)
        if todo and secs is not None:
            report([f"extract: {todo_tokens:,} tokens to capture (rendered): ~{minutes(secs)}"])
        try:
            if todo:
                backend = make_backend(
                    cfg.capture,
                    cfg.topology,
                    model_dir,
                    layer_ids,
                    dtype,
                    cfg.data.max_length,
                    trust_remote_code=cfg.model.trust_remote_code,
                )
                try:
                    writer.record_provenance({"capture": capture_route(cfg.capture.backend.value, backend)})
                    # a repair captures every sample it lost: no deadline
                    deadline = None if damaged else time_budget.capture_deadline(split, clock, len(todo))
                    capture_cut = _capture(backend, todo, writer, deadline)
                finally:
                    backend.close()
            if data.report.deadline_stop is not None or capture_cut is not None:
                # the samples done in time make the dataset
                writer.flush()  # the queued ones are durable, then counted
                done_ids = writer.done_ids()
                rendered = len(samples)
                samples = [s for s in samples if s.id in done_ids]
                val_ids = [i for i in val_ids if i in done_ids]
                cut = budget_cut(
                    cfg.data.max_samples,
                    rendered,
                    len(samples),
                    regeneration=data.report.deadline_stop,
                    capture=capture_cut,
                )
                writer.record_provenance({"budget_cut": cut})
            freq = token_frequencies(samples, cfg.model.vocab_size)
            size = min(cfg.train.draft_vocab_size, cfg.model.vocab_size)
            # this run's wall time, added to an earlier run's (a repair): what a time budget counts
            seconds = float(writer.manifest.provenance.get("extract_seconds", 0.0)) + clock.seconds()
            vocabs = {size: build_draft_vocab(freq, size)}
            manifest = writer.finish(freq, vocabs, val_ids=val_ids, provenance={"extract_seconds": round(seconds, 1)})
        except DiskSpaceError as e:  # the disk filled up during the run (another job, a bad estimate)
            raise DiskSpaceError(_disk_full_message(e, cfg, ds_dir, todo, writer, layer_ids, dtype)) from e
    finally:
        writer.close()
    console.print(
        f"[green]done: {manifest.num_samples} samples, {manifest.num_tokens} tokens "
        f"({manifest.num_loss_tokens} loss tokens) in {len(manifest.shards)} shards"
    )
    print(ds_dir)
    return str(ds_dir)


def _merge(cfg: RunConfig, ds_dir: Path, num_shards: int) -> str:
    """`extract.py <same overrides> num_shards=n merge=true`: the n parts -> one dataset."""
    size = min(cfg.train.draft_vocab_size, cfg.model.vocab_size)
    m = merge_parts(ds_dir, num_shards, draft_vocab_sizes=[size])
    console.print(
        f"[green]merged {num_shards} parts: {m.num_samples} samples, {m.num_tokens} tokens in {len(m.shards)} shards"
    )
    print(ds_dir)
    return str(ds_dir)


def _disk_full_message(
    e: DiskSpaceError, cfg: RunConfig, ds_dir: Path, todo, writer: ShardWriter, layer_ids: list[int], dtype
) -> str:
    done = writer.done_ids()
    left = [s for s in todo if s.id not in done]
    tokens = sum(int(s.input_ids.numel()) for s in left)
    need = disk_needed_bytes(
        tokens, len(layer_ids), cfg.model.hidden_size, dtype, len(left), cfg.capture.shard_max_tokens
    )
    return (
        f"{e}\n  {ds_dir}: {len(left)} samples are still to be written: about {format_bytes(need)} ({need} bytes) "
        f"more, {format_bytes(free_bytes(ds_dir))} free now. The {len(done)} samples already written are kept "
        "(nothing half-written is listed): free space, then re-run the same command to resume"
    )


def capture_route(backend_name: str, backend: CaptureBackend) -> str:
    """What the manifest records as the capture route: ``hf``, ``vllm/native`` or
    ``vllm/native_host_copy`` (the route the vLLM backend resolved at start)."""
    route = getattr(backend, "route", None)
    return f"{backend_name}/{route}" if route else backend_name


def _capture(backend: CaptureBackend, todo, writer: ShardWriter, deadline: Deadline | None = None) -> str | None:
    """Capture ``todo`` into ``writer``; stops at ``deadline`` and says why (None: all captured)."""
    feed = ((s.id, s.input_ids, s.loss_mask) for s in todo)
    t0, tokens, count, cut = time.perf_counter(), 0, 0, None
    if deadline is not None:
        console.print(f"capture ends by the time budget's deadline: within {minutes(max(0.0, deadline.left()))}")
    with _progress() as bar:
        task = bar.add_task("capture", total=len(todo), tok_s=0.0)
        # records come back per batch (longest first), paired with the id they were sent with
        for sample_id, record in backend.capture_with_ids(feed):
            writer.add(sample_id, record)
            fault("capture")
            tokens += int(record.token_ids.numel())
            count += 1
            bar.update(task, advance=1, tok_s=tokens / max(1e-9, time.perf_counter() - t0))
            if deadline is not None and count < len(todo) and deadline.passed():
                cut = (
                    f"{deadline.what} deadline (time_budget): {count} of {len(todo)} samples captured "
                    f"in {time.perf_counter() - t0:.0f} s"
                )
                break
    seconds = time.perf_counter() - t0
    if cut is not None:
        console.print(f"[yellow]capture stopped early: {cut}; the dataset is finished with them", soft_wrap=True)
    stats = getattr(backend, "stats", None)
    read = getattr(stats, "read_seconds", None)
    console.print(
        f"captured {tokens:,} tokens in {seconds:.1f} s ({tokens / max(1e-9, seconds):,.0f} tok/s)"
        + (f"; reading the connector's files: {read:.1f} s" if read is not None else ""),
        soft_wrap=True,  # one line in a log too: scripts grep it
    )
    return cut
