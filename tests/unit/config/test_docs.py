"""The docs' command finder reads what a doc shows (overrides, placeholders, prose), and the
tables of measured rates and step costs equal the data files the code reads
(scripts/docs_tables.py generates them). Every command of the docs composed:
integration/test_docs_commands.py; bench/ commands answering --help: integration/test_docs_bench.py."""

from __future__ import annotations

import subprocess
import sys

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
    results = (ROOT / "docs" / "results.md").read_text()
    assert "<!-- generated: rates.yaml -->" in results and "<!-- generated: step_costs.yaml -->" in results
