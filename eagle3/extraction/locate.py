"""Finding the dataset of a config under paths.datasets_dir (eagle3/extraction/identity.py names
it): by its fingerprint; then by the first scheme's (model directory name, chat file path and
engine in it); without the chat data at hand, the one dataset that matches all else. Otherwise
the error names the datasets of this model and data that are there and what differs in each."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from eagle3.data.conversation import DataError
from eagle3.extraction.identity import (
    CHAT_LOCATION,
    LEGACY_VERSION,
    DatasetIdentity,
    DatasetNotFound,
    fingerprint_inputs,
    legacy_fingerprint_inputs,
)
from eagle3.store import dataset_dir, dataset_fingerprint
from eagle3.store.layout import MANIFEST


def legacy_dataset_path(identity: DatasetIdentity) -> Path:
    return dataset_dir(identity.datasets_dir, identity.prefix, dataset_fingerprint(legacy_fingerprint_inputs(identity)))


def _diff(theirs: Any, ours: Any, where: str = "") -> list[str]:
    """Dotted keys whose values differ (two levels deep: "data.max_samples", "model.weights")."""
    if isinstance(theirs, dict) and isinstance(ours, dict) and where.count(".") < 1:
        out: list[str] = []
        for k in sorted(set(theirs) | set(ours)):
            out += _diff(theirs.get(k), ours.get(k), f"{where}.{k}" if where else k)
        return out
    return [] if theirs == ours else [where]


def _neighbours(identity: DatasetIdentity, ours: dict[str, Any]) -> list[tuple[Path, list[str], bool]]:
    """(directory, keys that differ from this config, made by the first scheme) of every
    dataset of this model and data preset under paths.datasets_dir, closest first."""
    root = Path(identity.datasets_dir)
    named = dataset_dir(root, identity.prefix, "0" * 16).name.removesuffix("-" + "0" * 16)
    legacy: dict | None = None
    found = []
    for manifest in sorted(root.glob(f"{named}-*/{MANIFEST}")):
        if not re.fullmatch(rf"{re.escape(named)}-[0-9a-f]{{16}}", manifest.parent.name):
            continue
        try:
            theirs = json.loads(manifest.read_text()).get("fingerprint_inputs") or {}
        except (OSError, json.JSONDecodeError):
            continue
        old = theirs.get("schema_version") == LEGACY_VERSION
        if old and legacy is None:
            legacy = legacy_fingerprint_inputs(identity)
        found.append((manifest.parent, _diff(theirs, legacy if old else ours), old))
    return sorted(found, key=lambda f: len(f[1]))


def locate_dataset(identity: DatasetIdentity) -> tuple[Path, str | None]:
    """The dataset of this config under paths.datasets_dir, and a note on how it was found (None:
    by its fingerprint). Then by the first scheme's fingerprint; without the chat data at hand,
    the one dataset that matches all else. Otherwise DatasetNotFound names the datasets of
    this model and data that are there, what differs, and dataset_dir=."""
    missing: DataError | None = None
    try:
        ours = fingerprint_inputs(identity)
    except DataError as err:  # the chat data is not on this machine: it cannot be hashed
        missing, ours = err, fingerprint_inputs(identity, chat_content=False)
    where = dataset_dir(identity.datasets_dir, identity.prefix, dataset_fingerprint(ours))
    if missing is None and (where / MANIFEST).is_file():
        return where, None
    old = legacy_dataset_path(identity)  # needs no chat content: the first scheme named its path
    if identity.storage.is_exact and (old / MANIFEST).is_file():  # the first scheme stored states exact
        return old, f"found by the first fingerprint scheme (model directory name and chat file path in it): {old}"
    near = _neighbours(identity, ours)
    if missing is not None:
        alike = [d for d, diff, legacy in near if not legacy and all(k.split(".")[-1] in CHAT_LOCATION for k in diff)]
        if len(alike) == 1:
            return alike[
                0
            ], f"the chat data is not here to hash ({missing}); {alike[0]} matches the rest of this config"
    lines = [
        f"no dataset for this config at {where}"
        if missing is None
        else f"no dataset for this config under {identity.datasets_dir} (the chat data could not be hashed: {missing})"
    ]
    for d, diff, legacy in near[:5]:
        if legacy:
            lines.append(
                f"  {d}: named by the first fingerprint scheme (model directory name, chat file path and "
                f"engine in it; differs in {', '.join(diff) or 'nothing'}): if it holds this model and data, "
                f"use it with dataset_dir={d}"
            )
        else:
            lines.append(f"  {d}: differs from this config in {', '.join(diff)}")
    lines.append(
        "run extract.py with the same model/layers/data overrides first (python extract.py <same overrides>), "
        "or pass dataset_dir=<dir>"
    )
    raise DatasetNotFound("\n".join(lines))
