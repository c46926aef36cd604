"""Turn a GEMM sweep's JSON (bench/gemm_sweep.py) into pallas_kernels/gemm_configs.py."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from pallas_kernels import gemm_configs


def module_header(docstring: str | None, comment: str, provenance: dict[str, Any]) -> list[str]:
    """A generated table module's first lines: its docstring, then `PROVENANCE` under
    `comment` (shared with bench/decode_table_writer.py)."""
    lines = [f'"""{docstring}"""', "", f"# {comment}",
             "PROVENANCE: dict[str, str | int | None] = {"]
    lines += [f"    {key!r}: {value!r}," for key, value in provenance.items()]
    return lines + ["}", ""]


def table_source(doc: dict[str, Any]) -> str:
    """The module's text: provenance from the sweep's meta, one entry per measured shape."""
    meta = doc["meta"]
    if meta.get("quick") or meta.get("platform") != "gpu":
        raise ValueError(f"results: a table needs a GPU sweep, not {meta.get('platform')!r}"
                         f"{' (--quick)' if meta.get('quick') else ''}")
    provenance = {key: meta.get(key) for key in ("command", "date", "device", "sms", "commit")}
    lines = module_header(gemm_configs.__doc__,
                          "The sweep: command, UTC date, GPU, its SM count, commit.", provenance)
    lines += ["# ((M, K, N), TuningConfig fields): each shape's fastest config in the sweep.",
              "ENTRIES: tuple[tuple[tuple[int, int, int], dict[str, int | str]], ...] = ("]
    for row in doc["shapes"]:
        if "best" not in row:
            continue
        fields = textwrap.wrap(repr(doc["configs"][row["best"]]), 90)
        lines.append(f"    ({tuple(row['shape'])!r},  # {row['ratio']:.3f}x cuBLAS")
        lines += [f"     {fields[0]}", *(f"      {line}" for line in fields[1:])]
        lines[-1] += "),"
    lines.append(")")
    return "\n".join(lines) + "\n"


def write_table(results: Path, table: Path) -> Path:
    table.write_text(table_source(json.loads(results.read_text())))
    return table
