"""Imports point down: every module under eagle3/ is parsed with `ast` (imports at any level,
including those inside functions) and each eagle3 import is checked against ALLOWED. The first
folder under eagle3/ is the layer:

    stages                                    (the root scripts call them: the verbs)
      -> planning                             (what a run costs: rates, time budget, disk)
        -> serving                            (the speed-up measurement, step costs, advice)
          -> training, evaluation, extraction (never each other)
        -> target, store                      (target: the model being served; store: the disk)
          -> draft, data                      (the head as plain torch; chat data)
            -> config                         (the typed schemas)
              -> util

training and evaluation never import each other: what both need (batching, the serving
format, W&B's mode) lives below both. draft/ is plain torch: no lightning, no hydra.

bench/, scripts/ and lab/ stand outside the package: they may import eagle3's public names only
(no module or name starting with `_`), and nothing in eagle3 imports them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "eagle3"

LAYERS = [
    "util",
    "config",
    "data",
    "draft",
    "target_model",
    "store",
    "extraction",
    "training",
    "evaluation",
    "serving",
    "planning",
    "stages",
]

# layer -> the layers it may import (itself included)
ALLOWED = {
    "util": {"util"},
    "config": {"config"},
    "data": {"data", "config", "util"},
    "draft": {"draft", "config", "util"},
    "target_model": {"target_model", "data", "config", "util"},
    "store": {"store", "data", "config", "util"},
    "extraction": {"extraction", "target_model", "store", "draft", "data", "config", "util"},
    "training": {"training", "target_model", "store", "draft", "data", "config", "util"},
    "evaluation": {"evaluation", "target_model", "store", "draft", "data", "config", "util"},
    "serving": {"serving", "evaluation", "target_model", "store", "draft", "data", "config", "util"},
    "planning": {"planning", "training", "extraction", "target_model", "store", "draft", "data", "config", "util"},
    "stages": set(LAYERS),
}

# third-party packages a group must not import
FORBIDDEN = {"draft": {"lightning", "pytorch_lightning", "hydra"}}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def group_of(module: str) -> str | None:
    """The layer of an eagle3 module: the first folder under eagle3/ (the package's own
    __init__ is the ground floor)."""
    parts = module.split(".")
    if parts[0] != "eagle3":
        return None
    if len(parts) == 1:
        return "util"
    return parts[1] if parts[1] in ALLOWED else None


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


def test_every_module_lives_in_a_layer_folder():
    """No loose modules: everything but the package's __init__ sits in a layer's folder."""
    assert [m for m in MODULES if group_of(m) is None] == []
    assert [p.name for p in PACKAGE.iterdir() if p.suffix == ".py"] == ["__init__.py"]
    assert sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py"))) == sorted(LAYERS)


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
    assert bad == [], "imports against the layering (tests/unit/stages/test_layering.py ALLOWED):\n" + "\n".join(bad)


def test_training_and_evaluation_never_import_each_other():
    assert "evaluation" not in ALLOWED["training"] and "training" not in ALLOWED["evaluation"]
    assert not ALLOWED["draft"] & {"training", "evaluation", "stages"}
    # each layer imports only layers listed before it in LAYERS (and itself): no cycle possible
    for layer, allowed in ALLOWED.items():
        assert all(LAYERS.index(a) <= LAYERS.index(layer) for a in allowed), layer


# ---------------------------------------------------------------- bench/, scripts/ and lab/

OUTSIDE_DIRS = ("bench", "scripts", "lab")
OUTSIDE = sorted(p for d in OUTSIDE_DIRS for p in (ROOT / d).rglob("*.py"))


def private_imports(source: str, filename: str = "<source>") -> list[str]:
    """Every eagle3 import in ``source`` that reaches a private module or name (a part starting
    with `_`, dunders such as __version__ aside), as "line: what"."""

    def private(part: str) -> bool:
        return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))

    bad = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "eagle3"]
            bad += [f"{node.lineno}: import {n}" for n in names if any(map(private, n.split(".")))]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "eagle3":
            module = node.module or ""
            for alias in node.names:
                if any(map(private, module.split("."))) or private(alias.name):
                    bad.append(f"{node.lineno}: from {module} import {alias.name}")
    return bad


def test_the_private_import_check_sees_private_names():
    assert private_imports("from eagle3.target_model.capture_hf import HFCaptureBackend, _load_base_model") == [
        "1: from eagle3.target_model.capture_hf import _load_base_model"
    ]
    assert private_imports("import eagle3.store._shards as s\nfrom eagle3._x import y") == [
        "1: import eagle3.store._shards",
        "2: from eagle3._x import y",
    ]
    assert private_imports("from eagle3 import __version__\nfrom eagle3.draft import DraftConfig") == []
    assert private_imports("from other._lib import _thing\nfrom . import _sibling") == []


def test_bench_scripts_and_lab_import_only_public_names():
    assert {p.relative_to(ROOT).parts[0] for p in OUTSIDE} == set(OUTSIDE_DIRS), (
        "a folder outside the package holds no Python file"
    )
    bad = [
        f"{path.relative_to(ROOT)}:{hit}" for path in OUTSIDE for hit in private_imports(path.read_text(), str(path))
    ]
    assert bad == [], "bench/, scripts/ and lab/ may import eagle3's public names only:\n" + "\n".join(bad)


def test_eagle3_never_imports_bench_scripts_or_lab():
    # bench files import each other by their bare names (bench/ on sys.path): those count too
    outside = set(OUTSIDE_DIRS) | {p.stem for p in OUTSIDE}
    bad = [
        f"{path.relative_to(ROOT)}:{line}: imports {imported}"
        for module, path in MODULES.items()
        for imported, line in imports_of(module, path)
        if imported.split(".")[0] in outside
    ]
    assert bad == [], "eagle3 imports bench/, scripts/ or lab/:\n" + "\n".join(bad)


def test_the_product_never_names_the_lab():
    # lab/ is the project's test bench: no code, config or data file of the product calls or reads it
    product = [p for d in ("eagle3", "conf") for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".yaml")]
    product += [ROOT / f"{entry}.py" for entry in ("extract", "train", "evaluate", "export")]
    bad = [str(p.relative_to(ROOT)) for p in product if re.search(r"(?<![\w/])lab/", p.read_text())]
    assert bad == [], "the product names lab/ (the project's test bench):\n" + "\n".join(bad)
