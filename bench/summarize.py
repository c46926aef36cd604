"""One table from many bench runs: `python -m bench.summarize DIR [DIR ...]`.

The H200 session splits the norm-gemm sweep over several invocations (each
under the device's per-command limit); this gathers every `norm-gemm.json`
found below the given folders and prints, per shape, the fused kernel against
our plain GEMM and XLA, the share of XLA's norm time hidden, and for decode
sizes the weight-streaming rate against the HBM copy bandwidth measured in
the same run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _rows(folders: list[Path]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("norm-gemm.json")):
            payload = json.loads(path.read_text())
            found += [(row, payload["ceilings"]) for row in payload["rows"] if row["status"] == "ok"]
    return found


def table(folders: list[Path]) -> str:
    by_shape: dict[tuple[int, int, tuple[int, ...]], dict[str, Any]] = {}
    ceilings: dict[tuple[int, int, tuple[int, ...]], dict[str, Any]] = {}
    for row, ceiling in _rows(folders):
        key = (row["k"], row["m"], tuple(row["ns"]))
        by_shape.setdefault(key, {})[row["impl"]] = row
        ceilings[key] = ceiling
    lines = [
        "| M x K x N | XLA norm+dot us | XLA dot us | plain us | fused us | fused/plain | "
        "fused/XLA | norm time hidden | weights TB/s (fused) | % copy BW |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (k, m, ns), impls in sorted(by_shape.items()):
        if not {"xla", "jaxnorm", "plain-gemm", "xla-dot"} <= impls.keys():
            continue
        t = {name: impls[name]["kernel_us"] for name in ("xla", "jaxnorm", "plain-gemm", "xla-dot")}
        norm_cost = t["xla"] - t["xla-dot"]
        hidden = (t["xla"] - t["jaxnorm"]) / norm_cost if norm_cost > 0 else float("nan")
        weight_bytes = 2 * k * sum(ns)
        rate = weight_bytes / (t["jaxnorm"] * 1e-6) / 1e12
        pct = 100 * rate * 1e12 / ceilings[(k, m, ns)]["hbm_bytes_per_s"]
        n = "+".join(map(str, ns))
        lines.append(
            f"| {m}x{k}x{n} | {t['xla']:.1f} | {t['xla-dot']:.1f} | {t['plain-gemm']:.1f} | "
            f"{t['jaxnorm']:.1f} | {t['jaxnorm'] / t['plain-gemm']:.3f} | "
            f"{t['jaxnorm'] / t['xla']:.3f} | {hidden:.2f} | {rate:.2f} | {pct:.0f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table([Path(p) for p in sys.argv[1:]] or [Path(__file__).parent / "results"]))
