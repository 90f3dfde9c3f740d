"""Markdown result tables: one row per run or method, one column per metric (CLI and demo output)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["TABLE_KEYS", "format_table"]

TABLE_KEYS: tuple[str, ...] = ("micro_f1", "macro_f1", "p@1", "p@5")


def format_table(rows: list[dict], keys: Sequence[str] = TABLE_KEYS, prefix: str = "test_") -> str:
    """A Markdown table: the first key of each row (its name) then ``prefix + key`` columns."""
    if not rows:
        return ""
    name_key = next(iter(rows[0]))
    header = [name_key, *keys]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    for row in rows:
        cells = [str(row[name_key])]
        for key in keys:
            value = row.get(prefix + key, row.get(f"validation_{key}"))
            cells.append(f"{value:.4f}" if isinstance(value, (int, float)) else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
