"""Imports point down: every module under eagle3/ is parsed with `ast` (imports at any level,
including those inside functions) and each eagle3 import is checked against ALLOWED.

    stages (eagle3/stages/, and the `python -m` entries eagle3/evaluate.py, eagle3/export.py)
      -> training, evaluation, extraction
        -> planning (cost, plan, identity)
          -> model, store, data, target, batches (the lower layer)
            -> util (atomic, faults, hashing, hidden_dtypes, locks, launch, layers, wandb_mode)

training and evaluation never import each other: what both need (batching, the serving
format, W&B's mode) lives below both. model/ is plain torch: no lightning, no hydra.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "eagle3"

# module (or package) -> group; the longest matching prefix wins
GROUPS = {
    "eagle3.stages": "stage",  # extract, train, evaluate, export: the only readers of the whole config
    "eagle3.evaluate": "stage",  # `python -m eagle3.evaluate`: the stage's Hydra entry
    "eagle3.export": "stage",  # `python -m eagle3.export`
    "eagle3.sweep": "stage",  # the multirun callback the entrypoints' Hydra config loads
    "eagle3.training": "training",
    "eagle3.evaluation": "evaluation",
    "eagle3.extraction": "extraction",
    "eagle3.cost": "planning",
    "eagle3.plan": "planning",
    "eagle3.identity": "planning",
    "eagle3.config": "util",  # the package: loads nothing of its own
    "eagle3.config.schema": "util",  # the typed schemas (imports nothing of ours): every layer takes them
    # the composition wiring: ConfigStore, the YAMLs' resolvers (plan, launch, layers, hub config
    # files) and cross-field checks (DraftConfig's norms), used by the stages and CLI entries
    "eagle3.config.registry": "compose",
    "eagle3.config.validate": "compose",
    "eagle3.model": "model",
    "eagle3.store": "store",
    "eagle3.data": "data",
    "eagle3.target": "target",
    "eagle3.batches": "batches",
    "eagle3.atomic": "util",
    "eagle3.faults": "util",
    "eagle3.hashing": "util",
    "eagle3.hidden_dtypes": "util",
    "eagle3.locks": "util",
    "eagle3.launch": "util",
    "eagle3.layers": "util",
    "eagle3.wandb_mode": "util",
    "eagle3": "util",  # the package's own __init__
}

LOWER = {"model", "store", "data", "target", "batches", "util"}

# importer group -> the groups it may import
ALLOWED = {
    "stage": {"stage", "training", "evaluation", "extraction", "planning", "compose"} | LOWER,
    "training": {"training", "planning"} | LOWER,
    # evaluation/config.py registers the evaluate CLI's schemas through the shared wiring
    "evaluation": {"evaluation", "planning", "compose"} | LOWER,
    "extraction": {"extraction", "planning"} | LOWER,
    "compose": {"compose", "planning", "model", "target", "util"},
    "planning": {"planning", "store", "data", "target", "util"},
    "model": {"model", "util"},
    "store": {"store", "data", "util"},
    "data": {"data", "util"},
    "target": {"target", "data", "util"},
    "batches": {"util"},
    "util": {"util"},
}

# third-party packages a group must not import
FORBIDDEN = {"model": {"lightning", "pytorch_lightning", "hydra"}}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def group_of(module: str) -> str | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        group = GROUPS.get(".".join(parts[:n]))
        if group is not None:
            return group
    return None


def imports_of(module: str, path: Path):
    """(imported module, line) for every import statement anywhere in the file; `from X import
    y` names X.y where that is a module of eagle3, else X."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in MODULES else base), node.lineno


def test_every_module_has_a_group():
    assert [m for m in MODULES if group_of(m) is None] == []
    assert set(GROUPS.values()) <= set(ALLOWED)


def test_imports_point_down():
    bad = []
    for module, path in MODULES.items():
        group = group_of(module)
        for imported, line in imports_of(module, path):
            top = imported.split(".")[0]
            if top in FORBIDDEN.get(group, ()):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {group} imports {imported}")
            if top != "eagle3":
                continue
            target = group_of(imported)
            if target not in ALLOWED[group]:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {group} ({module}) imports {target} ({imported})")
    assert bad == [], "imports against the layering (tests/test_layering.py ALLOWED):\n" + "\n".join(bad)


def test_training_and_evaluation_never_import_each_other():
    assert "evaluation" not in ALLOWED["training"] and "training" not in ALLOWED["evaluation"]
    assert not ALLOWED["model"] & {"training", "evaluation", "stage"}
