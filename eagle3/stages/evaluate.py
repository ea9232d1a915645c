"""`python evaluate.py export_dir=<dir>`: real acceptance of an exported EAGLE-3 head, measured
by vLLM (eagle3/evaluation/acceptance.py), as a stage with its own config (conf/evaluate.yaml).

    python evaluate.py export_dir=outputs/train/runs/<run>/export
    python evaluate.py export_dir=<dir> eval.num_draft_tokens=5 eval.max_prompts=64 logger=wandb
    python evaluate.py export_dir=<dir> target=<target dir> dataset_dir=<dataset dir>
    python evaluate.py export_dir=<dir> serving.measure=true serving.loads=[1,8,32,64] serving.draft_tokens=[1,2,3,5]

The last one measures serving instead (eagle3/serving/speedup.py): tok/s of the target
alone and with the head per load and K, the best K per load written into the export as
serving.json (serving.write_advice=false leaves it), the table in serving_speedup.json.
Either measurement written into the export rewrites its model card (README.md) with it.

Prints the acceptance table on stderr and the JSON path as the last stdout line. train.py
calls `evaluate_trained(...)` (`evaluate` with its config) at the end of training.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from pathlib import Path
from typing import Any, cast

from eagle3.config.cli import EvaluateConfig
from eagle3.config.schema import EvalConfig, RunConfig, plain, typed
from eagle3.draft.export_files import SPEEDUP
from eagle3.evaluation.acceptance import evaluate, vllm_available
from eagle3.stages.compose import register_evaluate_config
from eagle3.util.report import say


def evaluate_trained(
    cfg: RunConfig,
    export_dir: Path,
    dataset_dir: Path,
    target_dir: str,
    logger,
    out_dir: Path | None = None,
    baseline: bool = True,
) -> dict | None:
    """train.py's last step, from its config (``cfg``): real acceptance from vLLM's counters
    (eval.enabled and vLLM installed), as summary.json's "acceptance". A failure here is
    reported, not raised: the trained head and its export are already safe. ``out_dir``: where
    its files go (None: the export; polish.py measures a head it does not own); ``baseline``: also
    run the target alone (evaluate's; polish.py runs it once, with the polished head)."""
    if not cfg.eval.enabled:
        return None
    if not vllm_available():
        say(["eval: vLLM is not installed; skipping the acceptance measurement"])
        return None
    try:
        result = evaluate(
            export_dir,
            eval_cfg=cfg.eval,
            dataset_dir=dataset_dir,
            target=target_dir,
            out_dir=out_dir,
            chat_template=cfg.model.chat_template,
            baseline=baseline,
            engine=cfg.engine,  # conf/engine/default.yaml: the run's tp, memory and trust unless engine.* says
            wandb_run=logger.experiment if logger else None,
        )
    except Exception as e:  # noqa: BLE001 - reported in summary.json and on stderr
        say([f"eval failed: {type(e).__name__}: {e}"])  # stdout and train.log: summary.json keeps it too
        return {"error": f"{type(e).__name__}: {e}"}
    return {"json": str(result.json_path), "mean_acceptance_length": result.mean_acceptance_length}


class EvaluationFailedError(RuntimeError):
    """train.py's evaluation failed under ``eval.required=true``."""


def note_evaluation_failure(summary: dict[str, Any], export_dir: Path) -> str | None:
    """The line train.py ends with when its evaluation failed (also summary.json's "evaluation"),
    or None when it was measured or skipped."""
    error = (summary.get("acceptance") or {}).get("error")
    if error is None:
        return None
    summary["evaluation"] = f"evaluation failed: {error}; the head is exported: {export_dir}"
    return summary["evaluation"]


def require_evaluation(eval_cfg: EvalConfig, failure: str | None) -> None:
    """Raise ``EvaluationFailedError`` for a ``failure`` under ``eval.required=true``."""
    if failure is not None and eval_cfg.required:
        raise EvaluationFailedError(f"eval.required=true: {failure}")


# ---------------------------------------------------------------- the CLI

register_evaluate_config()


def run(cfg: Any) -> float:
    """The CLI's stage (cfg: the composed config, or an EvaluateConfig): an optional W&B run of
    its own (job_type=evaluate), then `evaluate`."""
    from eagle3.util.wandb_mode import wandb_mode

    c = typed(cfg, EvaluateConfig)
    out_dir = Path(c.out_dir) if c.out_dir else None
    if c.serving.measure:
        return run_serving(c, out_dir)
    run_ = None
    if c.logger.backend == "wandb":
        import wandb

        run_ = wandb.init(
            project=c.logger.project,
            entity=c.logger.entity,
            group=c.logger.group,
            tags=list(c.logger.tags),
            job_type="evaluate",
            # a user's string (logger.mode, WANDB_MODE): wandb checks it
            mode=cast(Any, wandb_mode(c.logger.mode)),
            dir=str(out_dir or c.export_dir),
            config=plain(c),
            reinit="create_new",
        )
    elif c.logger.backend != "none":
        raise ValueError(f"logger.backend: expected wandb|none, got {c.logger.backend!r}")
    try:
        result = evaluate(
            c.export_dir,
            eval_cfg=c.eval,
            dataset_dir=c.dataset_dir,
            target=c.target,
            out_dir=out_dir,
            chat_template=c.chat_template,
            baseline=c.baseline,
            engine=c.engine,
            wandb_run=run_,
        )
    finally:
        if run_ is not None:
            run_.finish()
    if result.json_path.parent.resolve() == Path(c.export_dir).expanduser().resolve():
        refresh_card(c.export_dir, result.report.target)  # written beside the head: its card shows it
    sys.stdout.flush()
    print(str(result.json_path))  # the last stdout line, for scripts
    return result.mean_acceptance_length


def run_serving(c: EvaluateConfig, out_dir: Path | None) -> float:
    """`serving.measure=true`: the serving measurement of the export; returns the best speed-up
    at the first load (1.0: none beats the target alone there)."""
    from eagle3.evaluation.export_info import read_export, served_engine
    from eagle3.serving.speedup import measure_serving

    info = read_export(c.export_dir, c.target)
    dataset = Path(c.dataset_dir).expanduser().resolve() if c.dataset_dir else info.dataset_dir
    out = (out_dir or info.export_dir) / SPEEDUP
    out.parent.mkdir(parents=True, exist_ok=True)
    serving = c.serving
    if serving.work_dir is None:  # one per export, outside it: a rerun reuses the engines that finished
        key = hashlib.sha1(str(Path(info.export_dir).resolve()).encode()).hexdigest()[:12]
        serving = dataclasses.replace(serving, work_dir=str(Path(c.paths.cache_dir) / "serving" / key))
    engine = served_engine(c.engine, info)  # the target the head was trained against
    result, _ = measure_serving(info.export_dir, str(info.target), dataset, serving, engine, out)
    if serving.write_advice:  # serving.json is in the export now: its card shows the measured speed-ups
        refresh_card(info.export_dir, info.target)
    sys.stdout.flush()
    print(str(out))  # the last stdout line, for scripts
    first = result["table"][min(result["table"])]
    return float(first["best_speedup"]) if first["best_k"] else 1.0


def refresh_card(export_dir: str | Path, target_dir: str | None = None) -> Path:
    """The export's model card (README.md) rewritten from the files now beside it
    (eagle3/serving/model_card.py): a measurement written into the export shows on its card."""
    from eagle3.serving.model_card import write_card

    return write_card(export_dir, target_dir=target_dir)
