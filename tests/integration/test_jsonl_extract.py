"""An extraction of a JSONL whose ids repeat finishes with each sample (the tiny target, in
process)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import chat_record


def test_extraction_of_repeated_ids_finishes_with_each_sample(tmp_path):
    """The real extract.py on a JSONL whose ids are x, x, x#2 (it used to capture, then die in the
    store on a second "x#2", naming neither file nor line)."""
    from conftest import compose

    from eagle3.stages.extract import run as extract
    from eagle3.store import Manifest

    path = tmp_path / "chats.jsonl"
    ids = ["x", "x", "x#2", "y"]
    path.write_text("".join(json.dumps(chat_record(i, rid, "openai")) + "\n" for i, rid in enumerate(ids)))
    cfg = compose(
        "extract",
        ["experiment=tiny_test", "data=jsonl", f"data.path={path}", f"paths.datasets_dir={tmp_path / 'data'}"],
    )
    manifest = Manifest.read(Path(extract(cfg)))
    assert manifest.complete and sorted(manifest.sample_ids) == ["x", "x#2", "x#3", "y"]
