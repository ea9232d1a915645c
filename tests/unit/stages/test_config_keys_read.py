"""Every key of every config schema is read by some code path: a key nothing reads is a setting
a user changes to no effect, silently (as model.quantization was before any engine received it).

The schemas are those the CLIs compose (RunConfig and the other CLIs' primaries, the groups
eagle3/stages/compose.py registers) and every dataclass nested in them. A field counts as read
when the package outside eagle3/config/ (and the root scripts) reads its name as an attribute
(``cfg.data.system_prompt``), a key (``entry["weight"]``, ``.get("path")``, ``.pop(...)``) or
names it in a tuple/list/set of keys it iterates (``HF_FIELDS``); or when a YAML of conf/ or a
schema's own computed default interpolates it (``${paths.root_dir}``). A mention in a message
string is no read. The rest must be in ALLOWED, each with why nothing in the package reads it.
By name, not by owner: a name read for one group counts for another group's field of that name."""

from __future__ import annotations

import ast
import dataclasses
import re
import typing

from conftest import ROOT

from eagle3.config import cli, polish, schema
from eagle3.stages import compose

PASSED_WHOLE = "passed whole to L.Trainer (eagle3/stages/train_parts.py trainer_arguments: dataclasses.asdict)"
SHOWN_ONLY = "computed for `--cfg job --resolve` to show (eagle3/planning/disk_estimate.py), never read"
ALLOWED = {
    "TrainerConfig.limit_train_batches": PASSED_WHOLE,
    "TrainerConfig.limit_val_batches": PASSED_WHOLE,
    "TrainerConfig.profiler": PASSED_WHOLE,
    "TrainerConfig.detect_anomaly": PASSED_WHOLE,
    "TrainerConfig.deterministic": PASSED_WHOLE,
    "TrainerConfig.benchmark": PASSED_WHOLE,
    "TrainerConfig.num_sanity_val_steps": PASSED_WHOLE,
    "CaptureConfig.disk_per_1m_tokens": SHOWN_ONLY,
    "CheckpointCallbackConfig.disk": SHOWN_ONLY,
}
PRIMARIES = (schema.RunConfig, cli.EvaluateConfig, cli.ExportCliConfig, cli.ReplayExportConfig, polish.PolishRunConfig)
_INTERPOLATED = re.compile(r"\$\{[^}$]*?\b([A-Za-z_][\w.]*)\}")


def _nested(cls: type) -> typing.Iterator[type]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        for arg in typing.get_args(hints[f.name]) or (hints[f.name],):
            for inner in typing.get_args(arg) or (arg,):
                if dataclasses.is_dataclass(inner) and isinstance(inner, type):
                    yield inner


def schema_fields() -> dict[str, str]:
    """ "Owner.field" -> field name, of every schema the CLIs compose and each one nested in them."""
    stack: list[type] = [*PRIMARIES, *compose._GROUPS.values()]
    seen: set[type] = set()
    out: dict[str, str] = {}
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        out.update({f"{cls.__name__}.{f.name}": f.name for f in dataclasses.fields(cls)})
        stack.extend(_nested(cls))
    return out


def _names_read(tree: ast.AST) -> set[str]:
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            read.add(node.attr)
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            read.add(str(node.slice.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            first = node.args[0]
            if node.func.attr in ("get", "pop", "setdefault") and isinstance(first, ast.Constant):
                read.add(str(first.value))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            read.update(str(e.value) for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return read


def names_read() -> set[str]:
    """Field names the package (outside eagle3/config/) and the root scripts read, and those
    conf/'s YAMLs and the schemas' computed defaults interpolate."""
    code = [p for p in (ROOT / "eagle3").rglob("*.py") if "config" not in p.relative_to(ROOT / "eagle3").parts[:1]]
    read: set[str] = set()
    for path in [*code, *ROOT.glob("*.py")]:
        read |= _names_read(ast.parse(path.read_text(), str(path)))
    texts = [p.read_text() for p in (ROOT / "conf").rglob("*.yaml")]
    texts += [p.read_text() for p in (ROOT / "eagle3" / "config").glob("*.py")]  # computed defaults
    for text in texts:
        for ref in _INTERPOLATED.findall(text):
            read.add(ref.split(".")[-1])
    return read


def test_every_config_key_is_read_or_allowed_with_a_reason():
    fields, read = schema_fields(), names_read()
    unread = sorted(key for key, name in fields.items() if name not in read and key not in ALLOWED)
    assert not unread, (
        f"config keys no code path reads: {unread}; wire each to what it configures, or remove it "
        "(refusing it by name where a user may still set it), or add it to ALLOWED with why"
    )


def test_the_allowlist_names_only_unread_fields_of_the_schemas():
    """An entry whose field went away or got a reader is stale: it would hide the next dead key."""
    fields, read = schema_fields(), names_read()
    stale = sorted(k for k in ALLOWED if k not in fields or fields[k] in read)
    assert not stale, f"ALLOWED entries that are no schema field or are read now: {stale}"
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_walk_finds_a_key_nothing_reads():
    """The check itself: a field of a made-up schema whose name nothing in the package reads."""

    @dataclasses.dataclass
    class Probe:
        quantization_that_nobody_reads: int = 0

    assert "quantization_that_nobody_reads" not in names_read()
    assert {"DataConfig.system_prompt", "ModelConfig.quantization", "EngineOptions.quantization"} <= set(
        schema_fields()
    )
