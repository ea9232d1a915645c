"""What the entrypoints print, read back."""

from __future__ import annotations


def printed_number(text: str) -> float:
    """A number as a report prints it (thousands separated by commas): 12,345.6 -> 12345.6."""
    return float(text.replace(",", ""))
