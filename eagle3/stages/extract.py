"""extract.py's stage: render chat data, capture hidden states, write the dataset.

Resumable: samples already in valid shards are skipped, so a killed run continues where
it stopped. A finished dataset is checked first (every shard's size and header; its sha256
too with capture.verify=full): a missing, short or corrupt shard is captured again from the
samples the manifest lists for it, in place, and only it; a whole one makes a re-run a no-op
that says so. A disk that fills up mid-run stops it with the bytes still needed; the shards
written so far are kept and the same command resumes.

Under ``time_budget.minutes`` regeneration and capture each stop at the end of their share of
the time shares (eagle3/planning/time_budget.py): the dataset is finished with the samples done by then,
validation samples spread through the capture order so a cut keeps the shares's proportions, and
its provenance records the cut (``budget_cut``).

The work is eagle3/extraction/'s: existing.py (what is on disk), write_dataset.py (render,
capture, write), capture_loop.py (the loop the benches run too); this module composes its inputs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console

from eagle3.config.choices import HiddenStates
from eagle3.config.schema import RunConfig, run_config
from eagle3.extraction.existing import find_existing_dataset
from eagle3.extraction.identity import DatasetIdentity, dataset_path, fingerprint_inputs
from eagle3.extraction.job import CaptureSetup, ExtractionJob, ExtractionTiming
from eagle3.extraction.write_dataset import MEASURED_RATES, extract_dataset
from eagle3.planning import machine_rates, time_budget
from eagle3.planning.cost import capture_seconds, extract_lines
from eagle3.stages.narrow import dataset_identity, regen_machine
from eagle3.stages.selection import selection_config, selection_line
from eagle3.stages.validate import config_torch_dtype, validate_run_config
from eagle3.store.layout import LOCK
from eagle3.store.merge import merge_parts
from eagle3.target_model.resolve import resolve_target
from eagle3.util.clock import StageClock
from eagle3.util.launch import extraction_shard
from eagle3.util.locks import DirLock
from eagle3.util.report import report

console = Console(stderr=True)


def run(composed: DictConfig) -> str:
    """``composed``: the config as composed; validated, then converted once to the RunConfig
    that everything below takes."""
    clock = StageClock()  # what this run costs: provenance.extract_seconds
    validate_run_config(composed)
    # time_budget.minutes: the data sized by the budget's shares (train.py makes the same)
    cfg, shares = time_budget.sized(run_config(composed))
    if shares is not None:
        report(shares.lines())
    target_dir = resolve_target(cfg.model, cfg.paths.cache_dir)
    picked = selection_config(cfg)
    if picked is not None and not cfg.merge and extraction_shard(cfg.num_shards, cfg.shard_index)[1] == 0:
        # before the training data: its minutes come out of the plan's fixed costs, not the answers'
        # share; written whole by the first of several extraction processes
        picked = dataclasses.replace(picked, num_shards=1, shard_index=0)
        report([selection_line(picked)])
        _extract(picked, dataset_identity(picked, target_dir), clock, None, primary=False)
    return _extract(cfg, dataset_identity(cfg, target_dir), clock, shares)


def _extract(
    cfg: RunConfig,
    identity: DatasetIdentity,
    clock: StageClock,
    shares: time_budget.TimeShares | None,
    primary: bool = True,
) -> str:
    """One dataset of cfg, written or completed. ``primary``: the training data, whose directory
    is printed on stdout (the line scripts read) and whose rates this machine's plans read."""
    if cfg.train.hidden_states == HiddenStates.online:
        return _token_dataset(cfg, identity, clock, shares)
    inputs = fingerprint_inputs(identity)
    dataset_dir = dataset_path(identity)
    # shard_index/num_shards, or srun's task rank when it started several extract processes
    num_shards, shard_index = extraction_shard(cfg.num_shards, cfg.shard_index)
    if cfg.merge:
        return _merge(cfg, dataset_dir, num_shards)
    found = find_existing_dataset(identity, dataset_dir, num_shards, shard_index, cfg.capture.verify.value)
    if found.complete:
        found.say_complete()
        return _said(found.dataset_dir, primary)
    job = ExtractionJob(identity, inputs, found, num_shards, shard_index)
    # one extraction per dataset, from here on: a second is refused at once, naming this one
    with DirLock(found.dataset_dir / LOCK, f"{found.dataset_dir}: another extraction is writing this dataset") as lock:
        report(extract_lines(cfg))  # what this run will cost, before any work
        manifest = extract_dataset(job, _capture_setup(cfg), _timing(cfg, shares, clock), lock)
        if primary:
            machine_rates.record(cfg, manifest.provenance.get(MEASURED_RATES) or {})
        return _said(found.dataset_dir, primary)


def _capture_setup(cfg: RunConfig) -> CaptureSetup:
    return CaptureSetup(
        capture=cfg.capture,
        topology=cfg.topology,
        dtype=config_torch_dtype(cfg.capture.dtype),
        regen=regen_machine(cfg),
        draft_vocab_size=cfg.head.draft_vocab_size,
    )


def _timing(cfg: RunConfig, shares: time_budget.TimeShares | None, clock: StageClock) -> ExtractionTiming:
    """The time budget's shares (``shares``; None: no budget) as the extraction's deadlines."""
    return ExtractionTiming(
        clock,
        regen_deadline=time_budget.regen_deadline(shares, clock),
        capture_deadline=lambda samples: time_budget.capture_deadline(shares, clock, samples),
        capture_estimate=lambda tokens: capture_seconds(cfg, tokens),
    )


def _token_dataset(
    cfg: RunConfig, identity: DatasetIdentity, clock: StageClock, shares: time_budget.TimeShares | None
) -> str:
    """The pre-pass of online training: samples and vocabulary, no hidden states."""
    from eagle3.extraction.tokens import prepare_token_dataset

    dataset_dir = prepare_token_dataset(
        identity, regen_machine(cfg), cfg.head.draft_vocab_size, clock, time_budget.regen_deadline(shares, clock)
    )
    return _said(dataset_dir)


def _merge(cfg: RunConfig, dataset_dir: Path, num_shards: int) -> str:
    """`extract.py <same overrides> num_shards=n merge=true`: the n parts -> one dataset."""
    size = min(cfg.head.draft_vocab_size, cfg.model.vocab_size)
    m = merge_parts(dataset_dir, num_shards, draft_vocab_sizes=[size])
    console.print(
        f"[green]merged {num_shards} parts: {m.num_samples} samples, {m.num_tokens} tokens in {len(m.shards)} shards"
    )
    return _said(dataset_dir)


def _said(dataset_dir: Path, say: bool = True) -> str:
    """The dataset's directory, printed on stdout (what scripts read; ``say``) and returned."""
    if say:
        print(dataset_dir)
    return str(dataset_dir)
