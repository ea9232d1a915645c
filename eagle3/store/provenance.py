"""How a dataset was captured, run by run (the manifest's ``provenance``).

``provenance.capture`` names the route of the latest run that captured into the dataset (``hf``,
``vllm/native``, ``vllm/native_host_copy``): a dataset resumed or repaired under another backend
used to say only that one. ``provenance.captures`` keeps every run, in order: ``{"route": ...,
"run": "extract" | "resume" | "repair"}``. A manifest written before the list (``capture`` alone)
reads as one run of that route, and the list starts from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CAPTURE = "capture"  # the latest run's route
CAPTURES = "captures"  # every run's route and kind, in order
RUN_KINDS = ("extract", "resume", "repair")


def capture_history(provenance: Mapping[str, Any]) -> list[dict[str, str]]:
    """Every capture run the provenance records, oldest first ([] for a dataset never captured)."""
    history = provenance.get(CAPTURES)
    if isinstance(history, list) and history:
        return [dict(entry) for entry in history]
    route = provenance.get(CAPTURE)
    return [{"route": str(route), "run": "extract"}] if route else []


def with_capture(provenance: Mapping[str, Any], route: str, run: str) -> dict[str, Any]:
    """The provenance fields to record for one more run capturing by ``route``: ``capture`` (that
    route, as before) and ``captures`` (the history with this run appended)."""
    if run not in RUN_KINDS:
        raise ValueError(f"provenance.captures: run: expected one of {list(RUN_KINDS)}, got {run!r}")
    return {CAPTURE: route, CAPTURES: [*capture_history(provenance), {"route": route, "run": run}]}


def capture_routes(provenance: Mapping[str, Any]) -> list[str]:
    """The routes that captured this dataset's samples, each once, in the order first used."""
    return list(dict.fromkeys(entry["route"] for entry in capture_history(provenance)))
