"""Every bench/ command of the docs answers --help (a subprocess each) and takes the flags the docs
give it."""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from conftest import ROOT
from helpers.docs import DOCS

# the commands of bench/ (its libraries, such as harness.py and step_profile.py, have no __main__)
BENCH = sorted(p for p in (ROOT / "bench").glob("*.py") if '__name__ == "__main__"' in p.read_text())


def bench_flags_in_docs() -> dict[tuple[str, str], set[tuple[str, str]]]:
    """(bench script, subcommand or "") -> {(where, --flag)} for every `python bench/<x>.py
    [subcommand] --flag` in the docs."""
    found: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        for n, line in enumerate(lines):
            i = n
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            for m in re.finditer(r"python3? bench/(\w+\.py)( [a-z][\w-]*)?([^`|;&#]*)", line):
                key = (m.group(1), (m.group(2) or "").strip())
                for flag in re.findall(r"(?<!\S)(--[\w-]+)", m.group(3)):
                    found.setdefault(key, set()).add((f"{doc.relative_to(ROOT)}:{n + 1}", flag))
    return found


def test_every_bench_command_answers_help_and_knows_the_flags_the_docs_give_it():
    def run(command: tuple[str, str]) -> tuple[tuple[str, str], int, str]:
        script, sub = command
        argv = [sys.executable, str(ROOT / "bench" / script), *([sub] if sub else []), "--help"]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
        return command, p.returncode, p.stdout + p.stderr

    used = bench_flags_in_docs()
    commands = sorted({(p.name, "") for p in BENCH} | {k for k in used if (ROOT / "bench" / k[0]).is_file()})
    with ThreadPoolExecutor(2) as pool:
        helps = {command: (rc, out) for command, rc, out in pool.map(run, commands)}
    bad = [
        f"bench/{s} {sub}: rc {rc}\n{out[-400:]}" for (s, sub), (rc, out) in helps.items() if rc or "usage:" not in out
    ]
    assert not bad, "\n".join(bad)
    assert len(helps) >= 10
    unknown = [
        f"{where}: bench/{script} {sub} {flag}"
        for (script, sub), uses in used.items()
        for where, flag in sorted(uses)
        if (script, sub) not in helps or flag not in helps[script, sub][1]
    ]
    assert not unknown, "flags the docs give a bench command that it does not take:\n" + "\n".join(unknown)
