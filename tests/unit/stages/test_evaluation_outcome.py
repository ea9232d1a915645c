"""train.py exits 0 when its acceptance evaluation fails (by design: the head is trained and
exported), and says so: its last line and summary.json name the failure; ``eval.required=true``
makes the failure end train.py with an error, after the summary and the export are written."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import compose

from eagle3.config.schema import EvalConfig, run_config
from eagle3.stages.evaluate import EvaluationFailedError, note_evaluation_failure, require_evaluation

EXPORT = Path("/runs/r1/export")


def test_a_failed_evaluation_is_said_in_the_summary_and_the_last_line():
    summary = {"acceptance": {"error": "RuntimeError: engine died"}}
    line = note_evaluation_failure(summary, EXPORT)
    assert line == f"evaluation failed: RuntimeError: engine died; the head is exported: {EXPORT}"
    assert summary["evaluation"] == line


def test_eval_required_makes_a_failed_evaluation_an_error():
    line = note_evaluation_failure({"acceptance": {"error": "RuntimeError: engine died"}}, EXPORT)
    require_evaluation(EvalConfig(), line)  # by default: exit 0, the failure said
    with pytest.raises(EvaluationFailedError, match=r"eval\.required=true.*RuntimeError: engine died"):
        require_evaluation(EvalConfig(required=True), line)


def test_a_measured_or_skipped_evaluation_changes_nothing():
    for acceptance in ({"json": "a.json", "mean_acceptance_length": 2.1}, None):
        summary = {"acceptance": acceptance}
        line = note_evaluation_failure(summary, EXPORT)
        require_evaluation(EvalConfig(required=True), line)
        assert line is None and "evaluation" not in summary


def test_eval_required_is_a_key_of_the_schema_off_by_default():
    assert run_config(compose("train", ["experiment=tiny_test"])).eval.required is False
    assert run_config(compose("train", ["experiment=tiny_test", "eval.required=true"])).eval.required is True
