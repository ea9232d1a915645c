"""One table of a whole sweep: ``<sweep dir>/sweep_results.csv`` and ``.md``.

A Hydra callback (registered in conf/hydra/default.yaml) that, in a multirun, records each
job's outcome in its own dir (``job_status.json``) when the job ends, and rebuilds the
sweep's table from what is on disk: every job dir's overrides, status and final metrics
(``summary.json``, written by train.py). Rebuilding from disk, not from memory, is what
makes it work with every launcher: submitit jobs end in other processes, on other nodes,
and a failed job (which stops Hydra before ``on_multirun_end``) still leaves the table
up to date with the jobs that ran, its own row saying FAILED.

    python train.py -m train.lr=1e-4,3e-4 train.ttt_steps=3,5
    cat outputs/train/multiruns/<time>/sweep_results.md
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from eagle3.config.schema import DEFAULT_OPTIMIZED_METRIC
from eagle3.util.atomic import write_text

DEFAULT_METRIC = DEFAULT_OPTIMIZED_METRIC
RESULTS_CSV = "sweep_results.csv"
RESULTS_MD = "sweep_results.md"
JOB_STATUS = "job_status.json"
SUMMARY = "summary.json"  # train.py's final metrics (eagle3.stages.train)
OVERRIDES = Path(".hydra") / "overrides.yaml"  # Hydra's own record of each job's overrides
_MD_METRICS = ("val/loss", "val/tokens", "train/loss")


@dataclass
class JobResult:
    job: str  # the job's subdir name (hydra.job.num by default)
    output_dir: Path
    status: str  # COMPLETED | FAILED | UNKNOWN (no record yet: running, or killed)
    overrides: list[str]
    metrics: dict[str, float] = field(default_factory=dict)  # summary.json "final", else the return value
    summary: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def params(self) -> dict[str, str]:
        out = {}
        for o in self.overrides:
            key, sep, value = o.partition("=")
            if sep:
                out[key.lstrip("+~")] = value
        return out


def _job_key(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 62, name)


def collect_jobs(sweep_dir: str | Path, metric: str = DEFAULT_METRIC) -> list[JobResult]:
    """Every job dir under ``sweep_dir`` (one holding Hydra's ``.hydra/overrides.yaml``)."""
    jobs = []
    for overrides_file in Path(sweep_dir).glob(f"*/{OVERRIDES}"):
        out = overrides_file.parent.parent
        overrides = [str(o) for o in cast(list[Any], OmegaConf.to_container(OmegaConf.load(overrides_file)))]
        job = JobResult(job=out.name, output_dir=out, status="UNKNOWN", overrides=overrides)
        status_file = out / JOB_STATUS
        if status_file.is_file():
            record = json.loads(status_file.read_text())
            job.status, job.error = record["status"], record.get("error")
            if isinstance(record.get("return_value"), (int, float)):
                job.metrics[metric] = float(record["return_value"])
        if (out / SUMMARY).is_file():
            job.summary = json.loads((out / SUMMARY).read_text())
            job.metrics.update({k: float(v) for k, v in job.summary.get("final", {}).items()})
        jobs.append(job)
    return sorted(jobs, key=lambda j: _job_key(j.job))


def swept_keys(jobs: list[JobResult]) -> list[str]:
    """Override keys whose value differs between jobs (the sweep's axes), in command-line order."""
    keys: list[str] = []
    for j in jobs:
        keys += [k for k in j.params if k not in keys]
    return [k for k in keys if len({j.params.get(k) for j in jobs}) > 1]


def best_job(jobs: list[JobResult], metric: str, maximize: bool = True) -> JobResult | None:
    scored = [j for j in jobs if j.status == "COMPLETED" and math.isfinite(j.metrics.get(metric, math.nan))]
    if not scored:
        return None
    return (max if maximize else min)(scored, key=lambda j: j.metrics[metric])


def _metric_columns(jobs: list[JobResult], metric: str) -> list[str]:
    seen = sorted({k for j in jobs for k in j.metrics} - {metric}, key=lambda k: (not k.startswith("val/"), k))
    return [metric] + seen


def results_rows(jobs: list[JobResult], metric: str) -> tuple[list[str], list[dict[str, Any]]]:
    """The CSV: job, status, swept params, every final metric, steps, paths, error."""
    axes = swept_keys(jobs)
    columns = [
        "job",
        "status",
        *axes,
        *_metric_columns(jobs, metric),
        "global_step",
        "best_metric_value",
        "output_dir",
        "export_dir",
        "overrides",
        "error",
    ]
    rows = []
    for j in jobs:
        row: dict[str, Any] = {"job": j.job, "status": j.status, **{k: j.params.get(k, "") for k in axes}}
        row.update(j.metrics)
        row.update({k: j.summary.get(k, "") for k in ("global_step", "best_metric_value", "export_dir")})
        row.update(output_dir=str(j.output_dir), overrides=" ".join(j.overrides), error=j.error or "")
        rows.append({c: row.get(c, "") for c in columns})
    return columns, rows


def _fmt(v: Any) -> str:
    if isinstance(v, str) and any(c in v for c in ".eE"):  # a swept float as typed, e.g. Optuna's 17 digits
        try:
            v = float(v)
        except ValueError:
            pass
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return str(v).replace("|", "\\|")


def results_markdown(jobs: list[JobResult], metric: str, maximize: bool, title: str) -> str:
    axes = swept_keys(jobs)
    extra = [c for c in _MD_METRICS if any(c in j.metrics for j in jobs)]
    acc = sorted(
        {k for j in jobs for k in j.metrics if k.startswith("val/acc_k")}, key=lambda k: int(k.rsplit("k", 1)[1])
    )
    columns = ["job", "status", *axes, metric, *acc, *extra, "global_step"]
    best = best_job(jobs, metric, maximize)
    lines = [
        f"# {title}",
        "",
        f"{len(jobs)} jobs, {sum(j.status == 'COMPLETED' for j in jobs)} completed; "
        f"{'max' if maximize else 'min'}imising `{metric}`"
        + (f"; best: job {best.job} ({_fmt(best.metrics[metric])})" if best else ""),
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for j in jobs:
        values = {
            "job": j.job + (" **best**" if best is j else ""),
            "status": j.status,
            **j.params,
            "global_step": j.summary.get("global_step", ""),
            **j.metrics,
        }
        lines.append("| " + " | ".join(_fmt(values.get(c, "")) for c in columns) + " |")
    failed = [j for j in jobs if j.error]
    if failed:
        lines += ["", "Failures:"] + [f"- job {j.job}: {j.error}" for j in failed]
    return "\n".join(lines) + "\n"


def _atomic_write(path: Path, text: str) -> None:
    # jobs of one sweep may end at the same time on different nodes: never a half-written table
    write_text(path, text)


def write_results(sweep_dir: str | Path, metric: str = DEFAULT_METRIC, maximize: bool = True) -> tuple[Path, Path]:
    """(Re)write ``sweep_results.csv`` and ``.md`` in ``sweep_dir`` from its job dirs."""
    sweep_dir = Path(sweep_dir)
    jobs = collect_jobs(sweep_dir, metric)
    columns, rows = results_rows(jobs, metric)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    csv_path, md_path = sweep_dir / RESULTS_CSV, sweep_dir / RESULTS_MD
    _atomic_write(csv_path, buf.getvalue())
    _atomic_write(md_path, results_markdown(jobs, metric, maximize, f"sweep {sweep_dir.name}"))
    return csv_path, md_path


def _is_rank_zero() -> bool:
    # a multi-task submitit job runs the job once per rank; one of them writes
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0


def _objective(config: DictConfig) -> tuple[str, bool]:
    metric = str(OmegaConf.select(config, "optimized_metric", default=None) or DEFAULT_METRIC)
    direction = OmegaConf.select(config, "hydra.sweeper.direction", default="maximize")
    if OmegaConf.is_list(direction):  # multi-objective Optuna: the table ranks by the first
        direction = direction[0]
    return metric, str(direction).lower() not in ("minimize", "studydirection.minimize")


class SweepResults(Callback):
    """Hydra callback: per-job status record + the sweep's results table."""

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN or not _is_rank_zero():
            return
        record: dict[str, Any] = {"status": "COMPLETED" if job_return.status == JobStatus.COMPLETED else "FAILED"}
        try:
            value = job_return.return_value
            record["return_value"] = value if isinstance(value, (int, float, str)) or value is None else repr(value)
        except Exception as e:  # the job raised: return_value re-raises it
            record["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:500]
        out = Path(config.hydra.runtime.output_dir)
        _atomic_write(out / JOB_STATUS, json.dumps(record, indent=1))
        metric, maximize = _objective(config)
        write_results(config.hydra.sweep.dir, metric, maximize)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        metric, maximize = _objective(config)
        sweep_dir = Path(config.hydra.sweep.dir)
        if sweep_dir.is_dir():
            _, md = write_results(sweep_dir, metric, maximize)
            print(f"sweep results: {md}")
