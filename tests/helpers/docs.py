"""The docs checked like code: README.md and docs/*.md (the changelog aside: it records what ran
then)."""

from __future__ import annotations

from conftest import ROOT

DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "changelog.md")]
