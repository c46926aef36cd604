"""Writing results down: tables (terminal and Markdown), JSON, plots, environment.

Tables are built once as plain rows of strings and rendered twice, so the
terminal and the Markdown file can never disagree.
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import ledger


@dataclass(frozen=True)
class TextTable:
    title: str
    headers: list[str]
    rows: list[list[str]]
    left_columns: int = 1
    """Leading text columns, aligned left; the rest are numbers, aligned right."""


def to_rich(table: TextTable) -> Table:
    out = Table(title=table.title, title_justify="left")
    for i, header in enumerate(table.headers):
        out.add_column(header, justify="left" if i < table.left_columns else "right")
    for row in table.rows:
        out.add_row(*row)
    return out


def to_markdown(table: TextTable) -> str:
    lines = [f"### {table.title}", "", "| " + " | ".join(table.headers) + " |"]
    numbers = len(table.headers) - table.left_columns
    lines.append("|" + "|".join(["---"] * table.left_columns + ["---:"] * numbers) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in table.rows]
    return "\n".join(lines) + "\n"


def print_tables(tables: list[TextTable], console: Console) -> None:
    for table in tables:
        console.print(to_rich(table))


def write_markdown(path: Path, heading: str, preamble: list[str], tables: list[TextTable]) -> None:
    body = [f"# {heading}", "", *preamble, ""] + [to_markdown(t) for t in tables]
    path.write_text("\n".join(body))


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=1, default=str))


def environment() -> dict[str, Any]:
    """What a reader needs to reproduce or distrust a number."""
    import jax
    import jaxlib

    env: dict[str, Any] = {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "devices": [d.device_kind for d in jax.devices()],
        "driver": None,
    }
    try:
        query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
        env["driver"] = subprocess.run(
            query, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        env["driver"] = f"unavailable ({type(err).__name__})"
    return env


def fmt(value: float | None, digits: int = 1) -> str:
    """Thousands separators; one more digit below 10 so small times keep two figures."""
    if value is None:
        return "-"
    return f"{value:,.{digits if abs(value) >= 10 else digits + 1}f}"


def results_table(title: str, rows: list[dict[str, Any]]) -> TextTable:
    """One line per (case, implementation) of a GPU suite."""
    headers = [
        "case", "impl", "kernel us", "wall us", "roofline us", "% roofline",
        "TFLOP/s", "GB/s", "% HBM", "status",
    ]  # fmt: skip
    body = []
    for r in rows:
        case = case_name(r)
        if r["status"] != "ok":
            failed = f"{r['status']}: {r['error'][:60]}"
            body.append([case, r["impl"], "-", "-", fmt(r["roofline_us"]), *["-"] * 4, failed])
            continue
        measured = [fmt(r["kernel_us"]), fmt(r["wall_us"]), fmt(r["roofline_us"])]
        derived = [fmt(r.get("pct_roofline")), fmt(r.get("tflops")), fmt(r.get("gbps"), 0)]
        body.append([case, r["impl"], *measured, *derived, fmt(r.get("pct_hbm")), "ok"])
    return TextTable(title, headers, body, left_columns=2)


def case_name(row: dict[str, Any]) -> str:
    return f"{row['label']} {row['shape']}".strip()


def _times_by_case(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per case, impl -> best time (us), for the cases where xla, jaxnorm and xla-dot ran."""
    times: dict[str, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["status"] == "ok":
            times[case_name(r)][r["impl"]] = r["best_us"]
    return {key: t for key, t in times.items() if {"xla", "jaxnorm", "xla-dot"} <= t.keys()}


def hidden_fractions(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per case, the share of XLA's separate-norm time the fused kernel removes.

    (t_xla - t_jaxnorm) / (t_xla - t_xla_dot): 1 = the norm is free, 0 = no
    better than XLA, None where XLA's norm costs nothing measurable. Where the
    norm costs XLA little the ratio is large and noisy; `plot_hidden` shows both terms.
    """
    hidden: dict[str, float | None] = {}
    for key, t in _times_by_case(rows).items():
        norm_cost = t["xla"] - t["xla-dot"]
        hidden[key] = (t["xla"] - t["jaxnorm"]) / norm_cost if norm_cost > 0 else None
    return hidden


ROOFLINE_CAPTION = (
    "each measured row at its ledger intensity (the FLOPs / bytes bench/ledger.py counts) "
    "against the roofline min(GEMM rate, intensity x HBM bandwidth) measured in this run; "
    "a point on the line runs at the bound, one a factor below it is that much slower")
HIDDEN_CAPTION = (
    "per case, in microseconds: what the separate norm costs XLA (t_xla - t_xla_dot, grey) "
    "and what jaxnorm saves against XLA (t_xla - t_jaxnorm, blue; left of 0 = jaxnorm slower). "
    "Blue as long as grey: the norm is free; longer: jaxnorm's GEMM also beat XLA's dot. The "
    "table's ratio is blue / grey, large and noisy where the norm costs XLA little")


def plot_roofline(rows: list[dict[str, Any]], ceilings: ledger.Ceilings, path: Path) -> None:
    """Each measured row at its ledger intensity, against the measured roofline."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 5.5))
    ok = [r for r in rows if r["status"] == "ok" and r.get("bytes")]
    intensities = [r["flops"] / r["bytes"] for r in ok] or [1.0]
    xs = np.logspace(np.log10(min(intensities) / 2), np.log10(max(intensities) * 2), 200)
    roof = np.minimum(ceilings.gemm_flops_per_s, xs * ceilings.hbm_bytes_per_s) / 1e12
    ax.plot(xs, roof, color="black", lw=1.5, label="measured roofline")
    for impl in sorted({r["impl"] for r in ok}):
        mine = [r for r in ok if r["impl"] == impl]
        xs_impl = [r["flops"] / r["bytes"] for r in mine]
        ax.scatter(xs_impl, [r["tflops"] for r in mine], label=impl, s=18, alpha=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ledger intensity (FLOP / byte)")
    ax.set_ylabel("achieved TFLOP/s (ledger FLOPs / time)")
    ax.set_title(f"{path.stem}: achieved rate against the roofline")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.text(0.01, 0.01, textwrap.fill(ROOFLINE_CAPTION, 130), fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_hidden(rows: list[dict[str, Any]], path: Path) -> None:
    """Per case, the separate norm's cost in XLA next to the time jaxnorm saves (HIDDEN_CAPTION)."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    times = _times_by_case(rows)
    names = list(times)
    cost = [times[n]["xla"] - times[n]["xla-dot"] for n in names]
    saved = [times[n]["xla"] - times[n]["jaxnorm"] for n in names]
    y = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(9, max(3.5, 0.45 * len(names) + 2)))
    ax.barh(y - 0.2, cost, height=0.4, color="tab:gray",
            label="separate norm's cost in XLA: t_xla - t_xla_dot")
    ax.barh(y + 0.2, saved, height=0.4, color="tab:blue",
            label="saved by jaxnorm: t_xla - t_jaxnorm")
    ax.axvline(0.0, color="black", lw=1)
    ax.set_yticks(y, names)
    ax.set_xlabel("microseconds (median kernel time differences)")
    ax.set_title(f"{path.stem}: the norm's cost in XLA and what jaxnorm saves")
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=8, loc="best")
    fig.text(0.01, 0.01, textwrap.fill(HIDDEN_CAPTION, 130), fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
