"""The docs' command finder reads what a doc shows (overrides, placeholders, prose), and the
tables of measured rates and step costs equal the data files the code reads
(scripts/docs_tables.py generates them), and every relative link of the docs resolves. Every command of the docs composed:
integration/test_docs_commands.py; bench/ commands answering --help: integration/test_docs_bench.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from helpers.docs import FILL, compose_as_entrypoint, doc_tokens, overrides_of


def test_the_finder_reads_what_a_doc_shows(tmp_path):  # no model.path here: any dir stands in
    tokens = doc_tokens("-m train.lr=1e-4,3e-4 layers.aux_ids=[3,15,26] export_dir=<dir> --cfg job --resolve ")
    assert overrides_of(tokens, tmp_path) == [
        "train.lr=1e-4",
        "layers.aux_ids=[3,15,26]",
        f"export_dir={FILL['export_dir']}",
    ]
    assert overrides_of(doc_tokens("<your overrides> capture.verify=full"), tmp_path) == ["capture.verify=full"]
    assert overrides_of(doc_tokens("and then some prose"), tmp_path) is None
    with pytest.raises(Exception, match="Could not override 'verifier'|Key 'verifier' is not in struct"):
        compose_as_entrypoint("evaluate", ["export_dir=x", "verifier=y"])  # a stale key fails the check


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
