"""Turn a decode GEMM run's JSON (bench/decode_gemm.py) into pallas_kernels/decode_configs.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pallas_kernels import decode_configs


def table_source(doc: dict[str, Any], command: str, commit: str) -> str:
    """The module's text: provenance, then each measured shape's fastest correct config
    with its ratio to cuBLAS in the same interleaved rounds."""
    if doc.get("smoke"):
        raise ValueError("results: a table needs a GPU run, not --smoke")
    env = doc["environment"]
    provenance = dict(command=command, date=env["date_utc"], device=env["devices"][0],
                      sms=doc.get("sms", 132), commit=commit)
    lines = [f'"""{decode_configs.__doc__}"""', "",
             "# The run: command, UTC date, GPU, its SM count, commit.",
             "PROVENANCE: dict[str, str | int | None] = {"]
    lines += [f"    {key!r}: {value!r}," for key, value in provenance.items()]
    lines += ["}", "",
              "# ((M, K, N), DecodeConfig fields, ours / cuBLAS): each shape's fastest config.",
              "ENTRIES: tuple[tuple[tuple[int, int, int], dict[str, int], float], ...] = ("]
    for row in doc["rows"]:
        best = next((c for c in row["configs"] if c["label"] == row.get("best")), None)
        if best is None:
            continue
        lines.append(f"    ({tuple(row['shape'])!r},")
        lines.append(f"     {best['config']!r}, {row['ratio']:.3f}),")
    lines.append(")")
    return "\n".join(lines) + "\n"


def write_table(results: Path, table: Path, *, command: str, commit: str) -> Path:
    table.write_text(table_source(json.loads(results.read_text()), command, commit))
    return table
