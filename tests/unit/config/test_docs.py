"""The docs are checked like code: every `python extract.py|train.py|evaluate.py|export.py ...`
line in README.md and docs/ (the changelog aside: it records what ran then) composes with
`--cfg job --resolve` as the entrypoint would compose it (placeholders filled), and the tables of measured rates and step costs equal the data files the
code reads (scripts/docs_tables.py generates them). bench/ commands answering --help:
integration/test_docs_bench.py."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from helpers.docs import DOCS
from omegaconf import OmegaConf

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
    return [(where, entry, _tokens(rest)) for where, entry, rest in found]


def _tokens(rest: str) -> list[str]:
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


def _compose(entry: str, overrides: list[str]):
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


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """A model=hf target's config.json (SmolLM2's shape) for `model.path=...` in the docs."""
    d = tmp_path_factory.mktemp("hf")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 30}
    config |= {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536}
    config |= {"vocab_size": 49152, "torch_dtype": "bfloat16", "tie_word_embeddings": True}
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_every_command_in_the_docs_composes(hf_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths of the docs land here, never in the clone
    commands = doc_commands()
    assert len(commands) > 50, commands  # the finder sees the docs' commands
    failures, composed = [], 0
    for where, entry, tokens in commands:
        overrides = overrides_of(tokens, hf_dir)
        if overrides is None:
            continue
        try:
            _compose(entry, overrides)
            composed += 1
        except Exception as e:  # noqa: BLE001 - every failure is reported together, by line
            failures.append(f"{where}: python {entry}.py {' '.join(tokens)}\n    {type(e).__name__}: {str(e)[:300]}")
    assert not failures, f"{len(failures)} command(s) in the docs do not compose:\n" + "\n".join(failures)
    assert composed > 40


def test_the_finder_reads_what_a_doc_shows(hf_dir):
    tokens = _tokens("-m train.lr=1e-4,3e-4 layers.aux_ids=[3,15,26] export_dir=<dir> --cfg job --resolve ")
    assert overrides_of(tokens, hf_dir) == [
        "train.lr=1e-4",
        "layers.aux_ids=[3,15,26]",
        f"export_dir={FILL['export_dir']}",
    ]
    assert overrides_of(_tokens("<your overrides> capture.verify=full"), hf_dir) == ["capture.verify=full"]
    assert overrides_of(_tokens("and then some prose"), hf_dir) is None
    with pytest.raises(Exception, match="Could not override 'verifier'|Key 'verifier' is not in struct"):
        _compose("evaluate", ["export_dir=x", "verifier=y"])  # a stale key fails the check


def test_the_tables_of_rates_and_step_costs_are_the_data_files():
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "docs_tables.py"), "--check"], capture_output=True, text=True, cwd=ROOT
    )
    assert p.returncode == 0, p.stdout + p.stderr + "\n(run: python scripts/docs_tables.py)"
    record = (ROOT / "docs" / "records" / "2026-12-05-multi-gpu-and-planner-rates.md").read_text()
    assert "<!-- generated: rates.yaml -->" in record and "<!-- generated: step_costs.yaml -->" in record


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings: lower case, punctuation dropped, spaces to '-'."""
    heads = re.findall(r"^#{1,6} (.+)$", doc.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def broken_links(docs: list[Path], root: Path = ROOT) -> list[str]:
    """Every relative link of ``docs`` whose file (or heading anchor) does not exist, as "where: link"."""
    bad = []
    for doc in docs:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # code blocks hold no links
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http(s):, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                bad.append(f"{doc.relative_to(root)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                bad.append(f"{doc.relative_to(root)}: {target} (no heading with that anchor)")
    return bad


def test_every_relative_link_in_the_docs_resolves():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert sum(len(LINK.findall(d.read_text())) for d in docs) > 20  # the finder sees the docs' links
    assert broken_links(docs) == []


def test_the_link_check_sees_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "a.md").write_text(
        "# A title\n[ok](a.md#a-title) [gone](b.md) [no anchor](a.md#other) [web](https://x.org)\n"
    )
    assert broken_links([tmp_path / "a.md"], tmp_path) == [
        "a.md: b.md (no such file)",
        "a.md: a.md#other (no heading with that anchor)",
    ]
