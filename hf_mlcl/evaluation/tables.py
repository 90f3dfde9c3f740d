"""Markdown result tables: one row per run or method, one column per metric (CLI and demo output)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["TABLE_KEYS", "format_table"]

TABLE_KEYS: tuple[str, ...] = ("micro_f1", "macro_f1", "p@1", "p@5")


def format_table(
    rows: list[dict], keys: Sequence[str] = TABLE_KEYS, prefix: str = "test_", show_split: bool = False
) -> str:
    """A Markdown table: the first key of each row (its name) then ``prefix + key`` columns; a row without
    any ``prefix`` metric shows its ``validation_`` ones instead. ``show_split`` adds a ``split`` column after
    the name saying which split each row reports (``test`` / ``validation``), so a run without a test split
    is never read as test figures."""
    if not rows:
        return ""
    name_key = next(iter(rows[0]))
    header = [name_key, *(["split"] if show_split else []), *keys]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    for row in rows:
        own = any(prefix + key in row for key in keys)
        split_prefix = prefix if own else "validation_"
        cells = [str(row[name_key])]
        if show_split:
            cells.append(split_prefix.rstrip("_"))
        for key in keys:
            value = row.get(split_prefix + key)
            cells.append(f"{value:.4f}" if isinstance(value, (int, float)) else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
