"""The suite and the code run from a clone at any path: no tracked file names this checkout's
absolute path or a cache directory outside the clone (a test that read a developer's
materialised model through its absolute path passed only next to that developer's cache)."""

import re
import subprocess

from conftest import ROOT

# an absolute path into some `.cache/` or `outputs/` folder: where materialised targets and runs live
ABSOLUTE_CACHE_PATH = re.compile(r"""["'=\s](/[\w.+-]+)+/(\.cache|outputs)\b""")


def _tracked_text_files():
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, names):
        path = ROOT / name.decode()
        try:
            yield path, path.read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue


def test_no_tracked_file_names_this_checkouts_path():
    here = str(ROOT)
    offenders = [str(p.relative_to(ROOT)) for p, text in _tracked_text_files() if here in text]
    assert not offenders, f"tracked files name the checkout's absolute path {here}: {offenders}"


def test_no_tracked_code_reaches_an_absolute_cache_path():
    offenders = []
    for path, text in _tracked_text_files():
        if path.suffix not in {".py", ".yaml", ".sh", ".toml", ".cfg"} or path.name == "test_portability.py":
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if ABSOLUTE_CACHE_PATH.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, "absolute cache paths in tracked code:\n" + "\n".join(offenders)
