"""A damaged dataset named by the first fingerprint scheme: extract.py does not announce a
repair the store then refuses; the refusal alone says what to do (tiny random Llama)."""

from __future__ import annotations

import pytest
from conftest import compose
from helpers.faults import ARGS, copy_dataset

from eagle3.extraction.identity import legacy_fingerprint_inputs
from eagle3.extraction.locate import legacy_dataset_path
from eagle3.stages.extract import run as extract
from eagle3.stages.narrow import dataset_identity
from eagle3.store import FingerprintMismatchError, Manifest, dataset_fingerprint
from eagle3.store.fingerprint import canonical
from eagle3.target_model.resolve import resolve_target


def test_a_damaged_first_scheme_dataset_is_refused_without_a_repairing_line(reference_dataset, tmp_path, capsys):
    cfg = compose("extract", ARGS + [f"paths.datasets_dir={tmp_path / 'data'}"])
    identity = dataset_identity(cfg, resolve_target(cfg.model, cfg.paths.cache_dir))
    ds = copy_dataset(reference_dataset, tmp_path / "data")  # a complete dataset of cfg
    old = legacy_dataset_path(identity)  # the same dataset as the first scheme named and recorded it
    ds.rename(old)
    m = Manifest.read(old)
    inputs = legacy_fingerprint_inputs(identity)
    m.fingerprint, m.fingerprint_inputs = dataset_fingerprint(inputs), canonical(inputs)
    m.write(old)
    shard = old / m.shards[0].file
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # damaged
    capsys.readouterr()

    with pytest.raises(FingerprintMismatchError, match="fingerprint scheme 1"):
        extract(cfg)
    assert "repairing" not in capsys.readouterr().err
