"""The one CSV reader of the data files: comment metadata (``# key: value``), a header,
rows of strings. `models.Dataset` files and `models.PopulationDataset` tables both use it."""

from __future__ import annotations

import csv
import io

__all__ = ["read_csv"]


def read_csv(text: str, label: str, what: str = "PopulationDataset"
             ) -> tuple[dict[str, list], dict[str, str]]:
    """CSV ``text`` (from ``label``, for messages; ``what`` reads it) as columns of strings
    in header order, and its ``# key: value`` comment metadata (repeated keys joined)."""
    path = label
    meta: dict[str, str] = {}
    body = []
    for line in text.splitlines():
        if line.startswith("#"):
            key, sep, value = line[1:].partition(":")
            if sep:
                key = key.strip().lower()
                meta[key] = (meta[key] + " " + value.strip()) if key in meta else value.strip()
            continue
        if line.strip():
            body.append(line)
    rows = list(csv.reader(io.StringIO("\n".join(body))))
    if not rows:
        raise ValueError(f"{what}: {path} has no header and no rows.")
    header = [h.strip() for h in rows[0]]
    cols: dict[str, list] = {h: [] for h in header}
    for lineno, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise ValueError(f"{what}: {path}, data row {lineno}: {len(row)} "
                             f"fields, expected {len(header)}.")
        for h, v in zip(header, row):
            cols[h].append(v.strip())
    return cols, meta
