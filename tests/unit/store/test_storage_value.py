"""StorageFormat, the shards' on-disk format as one value: checked once when built, its bytes per
token against what a written shard really holds, its round trips through the config, a manifest
and a shard's metadata, and its name."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from eagle3.store.layout import Manifest, StoreError
from eagle3.store.shard_file import ShardIdentity, map_shard, write_shard
from eagle3.store.storage_format import EXACT, FP8, INT4, StorageFormat
from eagle3.store.teacher_topk import TeacherProjection

L, H, V, DT = 4, 64, 300, torch.bfloat16
EVERY = [
    StorageFormat(),
    StorageFormat(FP8),
    StorageFormat(INT4),
    StorageFormat(FP8, 8),
    StorageFormat(INT4, 3),
]


@pytest.mark.parametrize(
    ("kind", "k", "error"),
    [
        ("int3", None, r"capture.storage: expected one of \['exact', 'fp8', 'int4'\], got 'int3'"),
        (8, None, r"capture.storage: expected one of \['exact', 'fp8', 'int4'\], got 8"),
        ("fp8", 0, r"capture.teacher_topk: expected null or an integer >= 1, got 0"),
        ("fp8", True, r"capture.teacher_topk: expected null or an integer >= 1, got True"),
        ("fp8", "32", r"capture.teacher_topk: expected null or an integer >= 1, got '32'"),
        ("exact", 32, r"capture.teacher_topk: expected null with capture.storage=exact .*got 32"),
    ],
)
def test_a_format_a_shard_cannot_hold_is_refused_when_built_naming_the_key(kind, k, error):
    with pytest.raises(ValueError, match=error):
        StorageFormat(kind, k)


def test_the_config_keys_build_it_once():
    capture = SimpleNamespace(storage="fp8", teacher_topk=32)
    assert StorageFormat.from_config(capture) == StorageFormat(FP8, 32)
    with pytest.raises(ValueError, match="capture.teacher_topk: expected null with capture.storage=exact"):
        StorageFormat.from_config(SimpleNamespace(storage="exact", teacher_topk=32))


def test_its_name_says_the_kind_and_the_top_k():
    assert [str(f) for f in EVERY] == ["exact", "fp8", "int4", "fp8+top8", "int4+top3"]


def _states(T: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(T)
    return (torch.randn(T, L, H, generator=g) * 3).to(DT)


def _projection(k: int) -> TeacherProjection:
    g = torch.Generator().manual_seed(k)
    return TeacherProjection(torch.rand(H, generator=g) + 0.5, 1e-5, torch.randn(V, H, generator=g).to(DT), k=k)


@pytest.mark.parametrize("fmt", EVERY, ids=str)
def test_bytes_per_token_is_what_a_written_shard_holds(tmp_path, fmt):
    """The disk check's per-token figure against the tensors of a real shard, byte for byte."""
    lengths = (5, 11, 2)
    ident = ShardIdentity("f" * 16, tuple(range(L)), H, DT, fmt)
    teacher = None if fmt.teacher_topk is None else _projection(fmt.teacher_topk)
    ids = [torch.arange(T) for T in lengths]
    path = tmp_path / "shard-00000.safetensors"
    write_shard(path, ident, ["a", "b", "c"], ids, [i % 2 == 0 for i in ids], [_states(T) for T in lengths], teacher)
    tensors = map_shard(path)
    assert set(tensors) == set(ident.tensors())
    T = sum(lengths)
    shapes, dtypes = fmt.tensor_shapes(T, L, H), fmt.tensor_dtypes(DT)
    for name in fmt.tensor_names():
        assert list(tensors[name].shape) == shapes[name] and tensors[name].dtype == dtypes[name]
    stored = sum(tensors[name].numel() * tensors[name].element_size() for name in fmt.tensor_names())
    assert stored == T * fmt.bytes_per_token(L, H, DT.itemsize)


def test_bytes_per_token_at_smollm2s_width():
    """SmolLM2 (4 x 576, bf16): exact 4,608; fp8 3 x (576 + 2) + 1,152; int4 3 x (288 + 36) + 1,152;
    the top-32 in place of the final layer 32 x (4 + 2)."""
    per = {str(f): f.bytes_per_token(4, 576, 2) for f in (*EVERY[:3], StorageFormat(FP8, 32))}
    assert per == {"exact": 4608, "fp8": 2886, "int4": 2124, "fp8+top32": 1926}


def test_an_int4_width_it_cannot_group_is_named():
    assert (
        StorageFormat(INT4).check_width(40) == "int4 groups 32 channels: expected a hidden size divisible by it, got 40"
    )
    assert StorageFormat(FP8).check_width(40) is None and StorageFormat(INT4).check_width(64) is None


@pytest.mark.parametrize("fmt", EVERY, ids=str)
def test_manifest_and_metadata_round_trips(fmt):
    assert StorageFormat.from_manifest(json.loads(json.dumps(fmt.to_manifest()))) == fmt
    assert StorageFormat.from_metadata(fmt.to_metadata()) == fmt
    assert all(isinstance(v, str) for v in fmt.to_metadata().values())


def test_the_identity_and_metadata_name_only_what_is_not_the_default():
    """What the dataset fingerprint hashed before the value existed: nothing for exact, the top-k
    only when set (the datasets written then keep their names)."""
    assert StorageFormat().fingerprint_inputs() == {} and StorageFormat().to_metadata() == {}
    assert StorageFormat(FP8).fingerprint_inputs() == {"storage": "fp8"}
    assert StorageFormat(INT4, 32).fingerprint_inputs() == {"storage": "int4", "teacher_topk": 32}
    assert StorageFormat(INT4, 32).to_metadata() == {"storage": "int4", "teacher_topk": "32"}
    assert StorageFormat.from_manifest({}) == StorageFormat.from_metadata({}) == StorageFormat(EXACT)
    with pytest.raises(ValueError, match="teacher_topk: expected the digits of an integer >= 1, got 'x'"):
        StorageFormat.from_metadata({"storage": "fp8", "teacher_topk": "x"})


def _manifest_json(storage: str, teacher_topk: int | None) -> str:
    """A manifest as written before StorageFormat: the fields in their order, the format's two last."""
    raw = {
        "fingerprint": "abc",
        "fingerprint_inputs": {"storage": storage},
        "layer_ids": [1, 2, 4],
        "hidden_size": H,
        "dtype": "bfloat16",
        "schema_version": 1,
        "format": "eagle3-hidden-states",
        "complete": True,
        "num_samples": 1,
        "num_tokens": 3,
        "num_loss_tokens": 2,
        "shards": [
            {"file": "shard-00000.safetensors", "num_samples": 1, "num_tokens": 3, "num_loss_tokens": 2}
            | {"size_bytes": 10, "sha256": "0" * 64}
        ],
        "sample_ids": ["s0"],
        "val_ids": [],
        "token_freq": "token_freq.safetensors",
        "vocabs": {"32": "vocab-32.safetensors"},
        "provenance": {"regen_engine": None},
        "hidden_states": "stored",
        "storage": storage,
        "teacher_topk": teacher_topk,
    }
    return json.dumps(raw, indent=1)


@pytest.mark.parametrize(("storage", "k"), [("exact", None), ("fp8", None), ("fp8", 32), ("int4", 8)])
def test_a_manifest_reads_into_the_value_and_writes_back_byte_for_byte(tmp_path, storage, k):
    text = _manifest_json(storage, k)
    (tmp_path / "manifest.json").write_text(text)
    m = Manifest.read(tmp_path)
    assert m.storage == StorageFormat(storage, k)
    assert m.to_json() == text


def test_a_manifest_written_before_the_keys_is_exact_and_a_bad_one_is_named(tmp_path):
    raw = json.loads(_manifest_json("exact", None))
    del raw["storage"], raw["teacher_topk"]
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    assert Manifest.read(tmp_path).storage == StorageFormat()
    raw |= {"storage": "exact", "teacher_topk": 4}
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(
        StoreError, match=r"manifest.json: keys storage, teacher_topk: capture.teacher_topk: expected null"
    ):
        Manifest.read(tmp_path)


def test_encode_refuses_a_projection_the_format_does_not_store():
    h = _states(3)
    with pytest.raises(ValueError, match="encode: teacher: expected a projection with k=8 for fp8\\+top8, got none"):
        StorageFormat(FP8, 8).encode(h)
    with pytest.raises(ValueError, match="expected a projection with k=None for exact, got k=4"):
        StorageFormat().encode(h, _projection(4))
    rows = StorageFormat(FP8, 4).encode(h, _projection(4))
    assert sorted(rows) == sorted(StorageFormat(FP8, 4).tensor_names())
    assert list(rows["teacher_ids"].shape) == [3, 4] and list(rows["hidden_aux"].shape) == [3, L - 1, H]
