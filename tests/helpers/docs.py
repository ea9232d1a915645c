"""The docs checked like code: README.md and docs/*.md (the changelog aside: it records what ran
then), the extract/train/evaluate/export command lines they show, read as Hydra overrides with
the placeholders filled, and composed as the entrypoint would compose them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from conftest import ROOT
from omegaconf import OmegaConf

DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "changelog.md")]
COMMAND = re.compile(r"\b(?:python3?|torchrun(?: --[\w-]+(?:[ =]\S+)?)*)\s+(extract|train|evaluate|export)\.py\b")
# a key's value where the doc writes a placeholder: what composing needs, nothing a run would read
FILL = {
    "export_dir": "outputs/train/runs/x/export",
    "dataset_dir": "data/x",
    "ckpt": "outputs/train/runs/x/checkpoints/last.ckpt",
    "out": "outputs/x/export",
    "push_to_hub": "org/name",
    "data.path": "chats.jsonl",
    "model.tokenizer_from": "tok",  # a tokenizer directory: read by a run, not by composing
    "hydra.run.dir": "outputs/x",
    "eval.max_prompts": "16",
    "experiment": "llama3_1_8b",  # "<recipe>": one of the GPU recipes
    "model.revision": None,  # dropped: a revision of a hub id needs the network
}


MANDATORY = {"evaluate": ("export_dir",), "export": ("ckpt",)}


def doc_commands() -> list[tuple[str, str, list[str]]]:
    """(where, entry, overrides) for every command line in the docs, continuations joined and
    the shell around it (&&, &, ;, |, #) cut off."""
    found = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        for n, line in enumerate(lines):
            i = n
            while line.rstrip().endswith("\\") and i + 1 < len(lines):  # a continued command
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            for m in COMMAND.finditer(line):
                rest = re.split(r"`|&&|\s&\s|\s&$|;|\||\s#", line[m.end() :] + " ")[0]
                found.append((f"{doc.relative_to(ROOT)}:{n + 1}", m.group(1), rest.strip()))
    return [(where, entry, doc_tokens(rest)) for where, entry, rest in found]


def doc_tokens(rest: str) -> list[str]:
    try:
        # "<your overrides>" standing alone is the reader's own; "key=<x>" is filled later
        return shlex.split(re.sub(r"(?<![=\w])<[^<>=]*>", " ", rest.replace("$i", "0")))
    except ValueError:  # an unclosed quote: the line goes on in prose
        return rest.split()


def _first(value: str) -> str:
    """A multirun list `a,b` -> its first value (commas inside brackets or calls stay)."""
    depth = 0
    for i, ch in enumerate(value):
        depth += ch in "[("
        depth -= ch in "])"
        if ch == "," and depth == 0:
            return value[:i]
    return value


def overrides_of(tokens: list[str], hf_dir: Path) -> list[str] | None:
    """The Hydra overrides of a doc's command, placeholders filled; None where a word is not an
    override (the doc's prose: `<your overrides>`, `...`)."""
    out: list[str] = []
    for i, tok in enumerate(tokens):
        if tok in ("-m", "--multirun", "--resolve", "--cfg", "...", "…"):
            continue
        if i and tokens[i - 1] == "--cfg":  # job | hydra | all
            continue
        if "=" not in tok:
            return None
        key, value = tok.split("=", 1)
        if re.fullmatch(r"(interval|choice|range|tag)\(.*\)", value):
            continue  # a sweeper's search space, read by the sweeper, not the job
        if "<" in value or value in ("...", "…"):
            if key not in FILL:
                raise AssertionError(f"no stand-in for the placeholder {tok!r}: add {key!r} to FILL")
            if FILL[key] is None:
                continue
            value = str(FILL[key])
        if key == "model.path":  # a target's config.json is read at compose time: a real one here
            value = str(hf_dir)
        out.append(f"{key}={_first(value)}")
    return out


def compose_as_entrypoint(entry: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from eagle3.stages import compose as wiring

    given = {o.split("=", 1)[0] for o in overrides}
    # the key a doc's short mention (`python evaluate.py`, `python export.py ...`) leaves to the reader
    overrides = overrides + [f"{k}={FILL[k]}" for k in MANDATORY.get(entry, ()) if k not in given]

    wiring.register_configs()
    if entry == "evaluate":
        wiring.register_evaluate_config()
    if entry == "export":
        wiring.register_export_config()
    if entry in ("train", "extract"):  # what the entrypoints add on this machine (no GPU here)
        overrides = overrides + wiring.machine_overrides(overrides, ROOT / "conf", gpus=0)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name=entry, overrides=overrides, return_hydra_config=True)
    from hydra.core.hydra_config import HydraConfig

    hydra_config = HydraConfig.instance()
    before = hydra_config.cfg
    hydra_config.set_config(cfg)  # ${hydra:...} resolves as in a run
    try:
        job = {k: cfg[k] for k in cfg if k != "hydra"}
        return OmegaConf.to_container(OmegaConf.create(job), resolve=True)  # --cfg job --resolve
    finally:
        hydra_config.cfg = before  # later tests read the run's choices from it (W&B tags): leave none behind
