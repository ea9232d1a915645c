"""The model card an export carries (its README.md), read back."""

from __future__ import annotations

from pathlib import Path


def card_text(export_dir: Path) -> str:
    return (export_dir / "README.md").read_text()


def card_row(card: str, label: str) -> list[str]:
    """The cells of the card's table row labelled ``label`` (exactly one such row)."""
    (line,) = [line for line in card.splitlines() if line.startswith(f"| {label} |")]
    return [cell.strip() for cell in line.strip("|").split("|")]
