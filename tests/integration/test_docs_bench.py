"""Every bench/ command of the docs answers --help and takes the flags the docs give it. One
subprocess asks them all (each script run as __main__ in turn): the heavy imports (torch, vLLM)
are paid once, not once per command."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from conftest import ROOT
from helpers.docs import DOCS

# the commands of bench/ (its libraries, such as harness.py and step_profile.py, have no __main__)
BENCH = sorted(p for p in (ROOT / "bench").glob("*.py") if '__name__ == "__main__"' in p.read_text())

# run in a child: each (script, subcommand) as __main__ with --help; prints {"script sub": [rc, output]}
ASK_HELP = r"""
import contextlib, io, json, runpy, sys
bench, commands = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, bench)  # the scripts import their sibling harness.py
answers = {}
for script, sub in commands:
    out = io.StringIO()
    sys.argv = [f"{bench}/{script}", *([sub] if sub else []), "--help"]
    rc = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:  # a script that breaks before its parser answers: its error is the finding
            rc, _ = 1, out.write(f"{type(e).__name__}: {e}")
    answers[f"{script} {sub}"] = [rc, out.getvalue()]
print(json.dumps(answers))
"""


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


def ask_help(commands: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, str]]:
    argv = [sys.executable, "-c", ASK_HELP, str(ROOT / "bench"), json.dumps(commands)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    answers = json.loads(p.stdout.strip().splitlines()[-1])
    return {(s, sub): (answers[f"{s} {sub}"][0], answers[f"{s} {sub}"][1]) for s, sub in commands}


def test_every_bench_command_answers_help_and_knows_the_flags_the_docs_give_it():
    used = bench_flags_in_docs()
    commands = sorted({(p.name, "") for p in BENCH} | {k for k in used if (ROOT / "bench" / k[0]).is_file()})
    helps = ask_help(commands)
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
