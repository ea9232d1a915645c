"""The hidden-state dataset on disk: the only code that knows its layout.

Capture writes through ``ShardWriter``; training reads through ``HiddenStateDataset``. An
online dataset (token ids only; the trainer runs the target) is ``write_token_dataset`` /
``TokenDataset``; ``open_dataset`` opens either.
"""

from eagle3.store.disk import DiskSpaceError, check_free_disk, disk_needed_bytes, format_bytes
from eagle3.store.fingerprint import dataset_dir, dataset_fingerprint
from eagle3.store.layout import (
    SCHEMA_VERSION,
    FingerprintMismatchError,
    IncompleteDatasetError,
    Manifest,
    ShardInfo,
    StoreError,
)
from eagle3.store.reader import DamagedDatasetError, HiddenStateDataset, shards_on_disk
from eagle3.store.token_samples import TokenDataset, open_dataset, write_token_dataset
from eagle3.store.vocab_files import DraftVocabs, add_vocab
from eagle3.store.writer import ShardWriter

__all__ = [
    "SCHEMA_VERSION",
    "DamagedDatasetError",
    "DiskSpaceError",
    "DraftVocabs",
    "FingerprintMismatchError",
    "HiddenStateDataset",
    "IncompleteDatasetError",
    "Manifest",
    "ShardInfo",
    "ShardWriter",
    "StoreError",
    "TokenDataset",
    "add_vocab",
    "shards_on_disk",
    "check_free_disk",
    "dataset_dir",
    "dataset_fingerprint",
    "disk_needed_bytes",
    "format_bytes",
    "open_dataset",
    "write_token_dataset",
]
