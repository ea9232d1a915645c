"""The content-hash cache's stamp holds the inode's ctime and number beside size and mtime: an
edit of the same size with its mtime put back (``touch -d``, ``cp -p``, ``rsync -t``) kept the old
hash, and with it the old dataset fingerprint. A user can set a file's mtime, not its ctime."""

from __future__ import annotations

import os

from eagle3.util.hashing import ContentShaCache, file_sha256


def _old_file(path, data: bytes) -> int:
    path.write_bytes(data)
    hour_ago = path.stat().st_mtime_ns - 3600 * 10**9
    os.utime(path, ns=(hour_ago, hour_ago))  # a file written just now is hashed every time
    return hour_ago


def test_a_same_size_edit_with_its_mtime_restored_is_hashed_again(tmp_path):
    file, cache = tmp_path / "chat.jsonl", tmp_path / "content_sha.json"
    mtime = _old_file(file, b"a" * 4096)
    first = ContentShaCache(cache).sha(file, "sha256", file_sha256)
    with open(file, "r+b") as f:  # the same size, another byte
        f.write(b"b")
    os.utime(file, ns=(mtime, mtime))  # the mtime put back
    assert ContentShaCache(cache).sha(file, "sha256", file_sha256) == file_sha256(file) != first


def test_a_file_replaced_by_one_of_the_same_size_and_mtime_is_hashed_again(tmp_path):
    file, cache = tmp_path / "chat.jsonl", tmp_path / "content_sha.json"
    mtime = _old_file(file, b"a" * 4096)
    first = ContentShaCache(cache).sha(file, "sha256", file_sha256)
    other = tmp_path / "other"
    other.write_bytes(b"c" * 4096)
    os.utime(other, ns=(mtime, mtime))
    os.replace(other, file)  # another inode under the name
    assert ContentShaCache(cache).sha(file, "sha256", file_sha256) == file_sha256(file) != first


def test_an_unchanged_file_is_not_hashed_again(tmp_path):
    file, cache = tmp_path / "chat.jsonl", tmp_path / "content_sha.json"
    _old_file(file, b"a" * 4096)
    ContentShaCache(cache).sha(file, "sha256", file_sha256)
    assert ContentShaCache(cache).sha(file, "sha256", lambda p: "hashed again") != "hashed again"
