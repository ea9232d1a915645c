"""What the store tells the user to do is what works: a corrupt manifest is fixed by deleting
that file alone (every whole shard is adopted, none captured again), and a damaged dataset
named by the first fingerprint scheme is refused as such, with nothing changed, and the
command that follows the message rebuilds it (tiny random Llama, real ShareGPT)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import compose
from helpers.faults import ARGS, assert_same_dataset, copy_dataset

from eagle3.extraction.identity import legacy_fingerprint_inputs
from eagle3.extraction.locate import legacy_dataset_path
from eagle3.stages.extract import run as extract
from eagle3.stages.narrow import dataset_identity
from eagle3.store import FingerprintMismatchError, Manifest, StoreError, dataset_fingerprint
from eagle3.store.fingerprint import canonical
from eagle3.target_model.resolve import resolve_target


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file() and not p.name.startswith(".")}


def test_a_corrupt_manifest_says_delete_only_it_and_doing_so_adopts_every_shard(reference_dataset, tmp_path):
    cfg = compose("extract", ARGS + [f"paths.datasets_dir={tmp_path / 'data'}"])
    ds, reference = copy_dataset(reference_dataset, tmp_path / "data"), reference_dataset
    manifest = ds / "manifest.json"
    manifest.write_text(manifest.read_text()[:300])  # cut short: not JSON
    shards = {p.name: p.stat().st_ino for p in ds.glob("shard-*.safetensors")}
    with pytest.raises(StoreError) as err:
        extract(cfg)
    msg = str(err.value)
    assert f"{manifest}: corrupt manifest" in msg and f"delete only this file (rm {manifest})" in msg
    assert "adopts every whole shard" in msg and "delete the directory" not in msg

    manifest.unlink()  # what the message says, nothing more
    assert extract(cfg) == str(ds)
    assert {p.name: p.stat().st_ino for p in ds.glob("shard-*.safetensors")} == shards  # adopted, not redone
    assert_same_dataset(ds, reference)


def test_a_damaged_first_scheme_dataset_is_refused_as_such_and_the_advice_works(reference_dataset, tmp_path):
    cfg = compose("extract", ARGS + [f"paths.datasets_dir={tmp_path / 'data'}"])
    identity = dataset_identity(cfg, resolve_target(cfg.model, cfg.paths.cache_dir))
    ds = copy_dataset(reference_dataset, tmp_path / "data")  # a complete dataset of cfg
    # the same dataset as the first fingerprint scheme named and recorded it
    old = legacy_dataset_path(identity)
    ds.rename(old)
    m = Manifest.read(old)
    inputs = legacy_fingerprint_inputs(identity)
    m.fingerprint, m.fingerprint_inputs = dataset_fingerprint(inputs), canonical(inputs)
    m.write(old)
    shard = old / m.shards[0].file
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # damaged
    before = _files(old)

    with pytest.raises(FingerprintMismatchError) as err:
        extract(cfg)
    msg = str(err.value)
    assert f"{old}: cannot be repaired or extended in place" in msg and "fingerprint scheme 1" in msg
    assert "nothing in it was changed" in msg and "Move it aside (or delete it) and re-run" in msg
    assert _files(old) == before  # as it says

    old.rename(tmp_path / "aside")  # what the message says
    again = Path(extract(cfg))
    assert again == ds and Manifest.read_complete(again) is not None
