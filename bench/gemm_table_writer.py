"""Turn a GEMM sweep's JSON (bench/gemm_sweep.py) into pallas_kernels/gemm_configs.py."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
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


def table_source(docs: Sequence[dict[str, Any]]) -> str:
    """The module's text: provenance from the sweeps' meta, one entry per measured shape
    (a shape several sweeps measured takes the last one's best)."""
    for doc in docs:
        meta = doc["meta"]
        if meta.get("quick") or meta.get("platform") != "gpu":
            raise ValueError(f"results: a table needs a GPU sweep, not {meta.get('platform')!r}"
                             f"{' (--quick)' if meta.get('quick') else ''}")
    metas = [doc["meta"] for doc in docs]
    if len({m["sms"] for m in metas}) > 1:
        raise ValueError("results: sweeps on GPUs with different SM counts")
    provenance = {"command": "; ".join(str(m.get("command")) for m in metas),
                  "date": max(m["date"] for m in metas), "device": metas[-1]["device"],
                  "sms": metas[-1]["sms"],
                  "commit": "; ".join(str(m.get("commit")) for m in metas)}
    lines = module_header(gemm_configs.__doc__,
                          "The sweeps: commands, UTC date of the last, GPU, its SM count, "
                          "commits.", provenance)
    lines += ["# ((M, K, N), TuningConfig fields): each shape's fastest config in the sweep.",
              "ENTRIES: tuple[tuple[tuple[int, int, int], dict[str, int | str]], ...] = ("]
    best: dict[tuple[int, ...], tuple[dict[str, Any], float]] = {}
    for doc in docs:
        for row in doc["shapes"]:
            if "best" in row:
                best[tuple(row["shape"])] = doc["configs"][row["best"]], row["ratio"]
    for shape, (config, ratio) in best.items():
        fields = textwrap.wrap(repr(config), 90)
        lines.append(f"    ({shape!r},  # {ratio:.3f}x cuBLAS")
        lines += [f"     {fields[0]}", *(f"      {line}" for line in fields[1:])]
        lines[-1] += "),"
    lines.append(")")
    return "\n".join(lines) + "\n"


def write_table(results: Sequence[Path], table: Path) -> Path:
    table.write_text(table_source([json.loads(path.read_text()) for path in results]))
    return table
