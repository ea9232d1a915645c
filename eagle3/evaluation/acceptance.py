"""Real acceptance of an exported EAGLE-3 head, measured by vLLM: ``evaluate``, which train.py's
end of run and ``python evaluate.py`` (eagle3/stages/evaluate.py) both call.

Loads the target with the head in vLLM (`method: eagle3`, K = eval.num_draft_tokens draft
tokens, greedy), runs held-out prompts (the project's broad suite over the eight MT-bench
categories, grade-school math word problems and HumanEval: the headline; the validation split's
opening user turns beside it, labelled in-distribution), every answer ending at natural EOS, and
reports from vLLM's own spec-decode counters the mean acceptance length (1 + accepted/drafts)
and the acceptance rate at each draft position, per set and per category with a bootstrap
interval over prompts, plus tokens/s with and without the head on the same prompts (two
engines, one after the other) and whether their greedy outputs agree. Writes acceptance.json and acceptance.png (into the export directory
unless out_dir=...), prints a table on stderr.

eval.diagnostics=true adds what explains a gap, at a cost: each greedy mismatch rerun through
the target in fp32, and two train-side estimates beside vLLM's figure (the head replayed on
the dataset's answers to the same val prompts, and on vLLM's own with-head outputs).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, cast

from eagle3.config.engine import EngineOptions
from eagle3.config.schema import EvalConfig
from eagle3.data.render import ChatStyle
from eagle3.draft.export_files import ENGINE_LOGS
from eagle3.evaluation.report import AcceptanceReport


@dataclass
class EvaluationResult:
    report: AcceptanceReport
    json_path: Path
    png_path: Path
    logged_to_wandb: bool

    @property
    def mean_acceptance_length(self) -> float:
        return self.report.mean_acceptance_length


def vllm_available() -> bool:
    """Whether the evaluation can run here (train.py's `eval.enabled` default is "if installed")."""
    return importlib.util.find_spec("vllm") is not None


def _engine_options(engine: EngineOptions | Mapping | Any | None) -> EngineOptions:
    if engine is None or isinstance(engine, EngineOptions):
        return engine or EngineOptions()
    from omegaconf import OmegaConf

    if OmegaConf.is_config(engine):
        engine = cast(dict[str, Any], OmegaConf.to_container(engine, resolve=True))
    return EngineOptions(**dict(engine))


def evaluate(
    export_dir: str | Path,
    *,
    eval_cfg: EvalConfig | Any | None = None,
    dataset_dir: str | Path | None = None,
    target: str | None = None,
    out_dir: str | Path | None = None,
    chat_template: str | None = None,
    baseline: bool = True,
    engine: EngineOptions | Mapping | None = None,
    wandb_run: Any = None,
    show_table: bool = True,
) -> EvaluationResult:
    """Measure the head in `export_dir` with vLLM; write acceptance.json/.png; log to W&B.

    eval_cfg: anything with num_draft_tokens, max_prompts, humaneval_prompts, max_new_tokens,
        diagnostics, and suite_prompts, math_prompts, prompts_apart, step_figures (cfg.eval of train.py's config;
        without the last four, EvalConfig's defaults); None: EvalConfig() defaults.
    dataset_dir: the hidden-state dataset whose validation split gives the chat prompts;
        None: summary.json beside the export, else HumanEval prompts only.
    target: the target directory; None: the export's speculators_config target.
    out_dir: where acceptance.json/.png and the engine logs (acceptance-logs/) go; None: export_dir.
    chat_template: the dataset's model.chat_template override, if any (None: the tokenizer's).
    baseline: also run the target alone (tokens/s without the head, greedy-output check).
    engine: EngineOptions (or a mapping of its fields) for both vLLM engines.
    wandb_run: the run to log eval/* to (train.py: its WandbLogger's `.experiment`);
        None: `wandb.run` if one is active, else nothing is logged.

    vLLM runs in child processes only, so this is safe to call from a process that has
    trained with Lightning and never needs an `if __name__ == "__main__"` guard of its own.
    """
    from transformers import AutoTokenizer

    from eagle3.evaluation.acceptance_run import run_acceptance
    from eagle3.evaluation.export_info import read_export, served_engine
    from eagle3.evaluation.plot import save_acceptance_plot
    from eagle3.evaluation.prompts import chat_style, heldout_prompts
    from eagle3.evaluation.report import print_table, write_json
    from eagle3.evaluation.wandb_log import log_report

    settings = eval_cfg if eval_cfg is not None else EvalConfig()
    options = _engine_options(engine)
    info = read_export(export_dir, target)
    options = served_engine(options, info)
    out_dir = Path(out_dir) if out_dir is not None else info.export_dir
    dataset = Path(dataset_dir).expanduser().resolve() if dataset_dir is not None else info.dataset_dir
    tokenizer = AutoTokenizer.from_pretrained(info.target, trust_remote_code=bool(options.trust_remote_code))
    template_kwargs, system_prompt = chat_style(dataset)  # as the dataset's samples were rendered
    prompts = heldout_prompts(
        dataset,
        int(settings.max_prompts),
        int(settings.humaneval_prompts),
        tokenizer,
        chat_template=chat_template,
        max_prompt_tokens=int(options.max_prompt_tokens),
        suite=int(getattr(settings, "suite_prompts", EvalConfig.suite_prompts)),
        math=int(getattr(settings, "math_prompts", EvalConfig.math_prompts)),
        template_kwargs=template_kwargs,
        system_prompt=system_prompt,
    )
    report = run_acceptance(
        info,
        prompts,
        num_draft_tokens=int(settings.num_draft_tokens),
        max_new_tokens=int(settings.max_new_tokens),
        engine=options,
        work_dir=out_dir / ENGINE_LOGS,
        baseline=baseline,
        diagnostics=bool(settings.diagnostics),
        prompts_apart=bool(getattr(settings, "prompts_apart", EvalConfig.prompts_apart)),
        step_figures=bool(getattr(settings, "step_figures", EvalConfig.step_figures)),
        style=ChatStyle(chat_template, template_kwargs, system_prompt),
    )
    report.dataset_dir = str(dataset) if dataset is not None else None
    if settings.diagnostics:
        _add_replays(report, info, dataset, prompts, settings)
    json_path = write_json(report, out_dir)
    png_path = save_acceptance_plot(report, out_dir)
    if show_table:
        print_table(report)
    logged = log_report(report, png_path, wandb_run)
    return EvaluationResult(report, json_path, png_path, logged)


def _add_replays(report: AcceptanceReport, info: Any, dataset: Path | None, prompts: Any, settings: Any) -> None:
    """The two train-side estimates beside vLLM's figure (eval.diagnostics): the head replayed on
    the dataset's answers to the val prompts served, and on vLLM's own with-head outputs. Each
    runs the target (or reads its shards) again; a gap to vLLM points at a train/serve mismatch."""
    from eagle3.evaluation.diagnostics.head_replay import replay_for_prompts
    from eagle3.evaluation.diagnostics.served_replay import replay_served
    from eagle3.evaluation.prompts import VAL

    k, answer = int(settings.num_draft_tokens), int(settings.max_new_tokens)
    val_ids = [p.id for p in prompts.by_source(VAL)]
    replay, note = replay_for_prompts(
        info.export_dir, info.target, dataset, val_ids, num_draft_tokens=k, max_answer_tokens=answer
    )
    report.train_side_replay = replay or {}
    report.prompt_notes += [note] if note else []
    report.served_replay, note = replay_served(
        info.export_dir, info.target, report.served, num_draft_tokens=k, max_answer_tokens=answer
    )
    report.prompt_notes += [note] if note else []
