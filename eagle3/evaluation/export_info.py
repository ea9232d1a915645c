"""What the evaluation needs to know about an export directory: that it is an EAGLE-3 head
(eagle3/draft/serving_format.py reads its config.json), which target it was trained
against on this machine, and which dataset its training read (summary.json beside it)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from eagle3.config.engine import EngineOptions
from eagle3.draft.export_files import CONFIG
from eagle3.draft.serving_format import ExportError, read_config

__all__ = ["ExportError", "ExportInfo", "read_export", "served_engine"]


@dataclass
class ExportInfo:
    export_dir: Path
    target: str  # a local directory (resolved) or a hub id
    aux_layer_ids: list[int]
    draft_vocab_size: int
    dataset_dir: Optional[Path]  # from summary.json beside the export, if train.py wrote one
    # the target's quantization the head was trained against (eagle3_meta.json serve_quantization,
    # vLLM's name); None: unquantized, or an export written before it was recorded
    quantization: Optional[str] = None


def served_engine(options: EngineOptions, info: ExportInfo) -> EngineOptions:
    """The engine options with the export's quantization where engine.quantization is null: the
    head is measured against the target it was trained against (evaluate.py has no model group)."""
    if options.quantization is not None or not info.quantization:
        return options
    return replace(options, quantization=info.quantization)  # type: ignore[arg-type]  # vLLM's name


def _find_relative(path: Path, export_dir: Path, marker: str) -> Optional[Path]:
    """`path` (relative) holding `marker`, from the current directory or a parent of the export."""
    for base in [Path.cwd(), *export_dir.resolve().parents]:
        if (base / path / marker).is_file():
            return (base / path).resolve()
    return None


def _resolve_target(given: str, export_dir: Path, config_file: Path) -> str:
    """An absolute path is used as is. A relative one was written relative to the directory
    train.py ran in: try the current directory, then each parent of the export (the run dir
    sits under <project>/outputs/...). A name that is no directory anywhere is a hub id."""
    path = Path(given).expanduser()
    if path.is_absolute():
        if not path.is_dir():
            raise ExportError(
                f"{config_file}: speculators_config.verifier.name_or_path={given!r} does not exist; "
                "pass target=<target dir>"
            )
        return str(path)
    found = _find_relative(path, export_dir, CONFIG)
    if found is not None:
        return str(found)
    if given.count("/") == 1 and not given.startswith("."):
        return given  # hub id, e.g. "HuggingFaceTB/SmolLM2-135M-Instruct"
    raise ExportError(
        f"{config_file}: speculators_config.verifier.name_or_path={given!r} is relative and no directory "
        f"with a config.json matches it from {Path.cwd()} or any parent of {export_dir}; pass target=<target dir>"
    )


def read_export(export_dir: str | Path, target: str | None = None) -> ExportInfo:
    export_dir = Path(export_dir).expanduser()
    config_file = export_dir / CONFIG
    cfg = read_config(export_dir)
    summary_file = export_dir.parent / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    if target is None:
        given = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
        if not given:
            raise ExportError(f"{config_file}: no speculators_config.verifier.name_or_path; pass target=<target dir>")
        local = Path(summary.get("target_dir") or "").expanduser()
        if summary.get("target_dir") and local.is_dir() and not Path(given).expanduser().is_dir():
            # the export names the target as the serving machine knows it (a hub id); the run
            # that trained it recorded the local copy it read, the same weights, usable offline
            target = str(local.resolve())
        else:
            target = _resolve_target(str(given), export_dir, config_file)
    elif Path(target).expanduser().is_dir():
        target = str(Path(target).expanduser().resolve())
    dataset_dir = None
    recorded = summary.get("dataset_dir")
    if recorded:
        path = Path(recorded).expanduser()
        dataset_dir = (
            path if path.is_absolute() and path.is_dir() else _find_relative(path, export_dir, "manifest.json")
        )
    return ExportInfo(
        export_dir=export_dir.resolve(),
        target=str(target),
        aux_layer_ids=[int(i) for i in cfg.get("eagle_aux_hidden_state_layer_ids") or []],
        draft_vocab_size=int(cfg.get("draft_vocab_size") or 0),
        dataset_dir=dataset_dir,
        quantization=_meta(export_dir).get("serve_quantization"),
    )


def _meta(export_dir: Path) -> dict:
    path = export_dir / "eagle3_meta.json"
    return json.loads(path.read_text()) if path.is_file() else {}
