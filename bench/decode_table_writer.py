"""Turn decode runs' JSON into the measured tables dispatch reads: bench/decode_gemm.py ->
pallas_kernels/decode_configs.py, bench/decode_groups.py -> decode_gated_measured.py,
bench/decode_attention_bench.py -> decode_attention_measured.py (jaxnorm/backends)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.gemm_table_writer import module_header
from pallas_kernels import decode_configs, hardware


def xla_slice_share(xla: dict[str, Any] | None) -> float:
    """The share of an XLA baseline's kernel time (a timing entry with "kernels") that a
    model does not pay: its slice kernels. XLA merges dots that share x into one GEMM (its
    dot merger), so a bench that returns each weight's output ran one GEMM and a slice
    kernel per output: 21-54% of the decode GEMM's baseline at M = 8, 5-12% of the
    attention input's (v, returned as it is) (bench/results/2026-12-05-decode-cold). In a
    model the slices fuse into their consumers: Llama-3.2-1B's decode step at B = 8 lost
    23 us of GEMM time when its four q/k/v GEMMs left cuBLAS, 5.8 us each, where the
    bench's baseline was 9.4 us a launch."""
    kernels = (xla or {}).get("kernels") or []
    total = sum(us for _, us in kernels)
    return sum(us for name, us in kernels if "slice" in name) / total if total else 0.0


def without_slices(ratio: float, xla: dict[str, Any] | None) -> float:
    """A ratio to an XLA baseline's time, made a ratio to that time less its slice kernels
    (`xla_slice_share`): what the baseline costs in a model."""
    return ratio / (1 - xla_slice_share(xla))


def _entries(docs: Sequence[dict[str, Any]]) -> dict[tuple, tuple[dict[str, int], float]]:
    """(M, K, (N_i...)) -> (fastest correct config, its ratio to cuBLAS's time less its
    slice kernels, `xla_slice_share`); later runs win."""
    entries = {}
    for row in _gpu_rows(docs):
        best = next((c for c in row["configs"] if c["label"] == row.get("best")), None)
        if best is not None:
            m, k, n = row["shape"]
            entries[(m, k, tuple(row.get("ns", [n])))] = (
                best["config"], without_slices(row["ratio"], row.get("xla")))
    return entries


def _header(docstring: str | None, docs: Sequence[dict[str, Any]], command: str,
            commit: str) -> list[str]:
    """The table module's docstring and PROVENANCE from the runs (the last one's date and GPU;
    runs written before the JSON recorded its SM count ran on the H200)."""
    env = docs[-1]["environment"]
    provenance = dict(command=command, date=env["date_utc"], device=env["devices"][0],
                      sms=docs[-1].get("sms", hardware.H200_SMS), commit=commit)
    return module_header(docstring, "The runs: commands, UTC date of the last, GPU, its SM "
                         "count, commits.", provenance)


def add_table_arguments(parser: argparse.ArgumentParser, table: str, command: str) -> None:
    """--write-table, --run-command, --run-commit: a bench's measured-table mode."""
    parser.add_argument("--write-table", metavar="RESULTS_JSON", type=Path, nargs="+",
                        help=f"write {table} from GPU runs' JSON (a shape measured twice: "
                             "the later file's) and exit")
    parser.add_argument("--run-command", default=command,
                        help="with --write-table: the commands that produced the JSON")
    parser.add_argument("--run-commit", default="unknown",
                        help="with --write-table: the commits the runs measured")


def table_source(docs: Sequence[dict[str, Any]], command: str, commit: str) -> str:
    """The module's text: provenance, then each measured launch's fastest correct config
    with its ratio to one cuBLAS dot per weight in the same interleaved rounds."""
    entries = _entries(docs)
    lines = _header(decode_configs.__doc__, docs, command, commit)
    lines += ["# ((M, K, (N_i...)), DecodeConfig fields, ours / cuBLAS): each launch's fastest.",
              "ENTRIES: tuple[tuple[tuple[int, int, tuple[int, ...]], dict[str, int], float], "
              "...] = ("]
    for shape, (config, ratio) in entries.items():
        # The default reduction is left out, as runs before the field existed recorded it.
        fields = {k: v for k, v in config.items() if (k, v) != ("reduction", "xla")}
        lines.append(f"    ({shape!r},")
        lines.append(f"     {fields!r}, {ratio:.3f}),")
    lines.append(")")
    return "\n".join(lines) + "\n"


def _ratio(ratio: float | None) -> str:
    return "None" if ratio is None else f"{ratio:.3f}"


def _gpu_rows(docs: Sequence[dict[str, Any]]):
    """Every row of the runs, in order (a later run's row of one shape wins)."""
    for doc in docs:
        if doc.get("smoke"):
            raise ValueError("results: a table needs a GPU run, not --smoke")
        yield from doc["rows"]


def _table(comment: str, name: str, entry_type: str, entries: list[str]) -> list[str]:
    """One tuple of a table module, an entry per line, under its comment."""
    return [f"# {comment}", f"{name}: tuple[{entry_type}, ...] = (",
            *(f"    {entry}," for entry in entries), ")"]


def _ratios_module(docstring: str | None, docs: Sequence[dict[str, Any]], command: str,
                   commit: str, fields: str, entry_type: str, entries: list[str],
                   *more: list[str]) -> str:
    """A measured-ratios table module: docstring, PROVENANCE, ENTRIES one per line, then
    any `more` tables (`_table`), each after a blank line."""
    lines = _header(docstring, docs, command, commit)
    lines += _table(f"({fields}).", "ENTRIES", entry_type, entries)
    for table in more:
        lines += ["", *table]
    return "\n".join(lines) + "\n"


def gated_table_source(docs: Sequence[dict[str, Any]], command: str, commit: str) -> str:
    """jaxnorm/backends/decode_gated_measured.py's text from bench/decode_groups.py runs:
    per measured shape the fastest correct kernel config with the gain folded, its ratio to
    stock, and the unfolded op's ratio (None where that variant was not timed); later runs
    win. The config is what `gated_decode_config` then runs near that shape."""
    from bench import decode_groups
    from jaxnorm.backends import decode_gated_measured

    entries: dict[tuple[int, int, int], tuple] = {}
    for row in _gpu_rows(docs):
        timed = [e for e in row["variants"]
                 if e["label"] not in decode_groups.BASELINES and "vs_stock" in e]
        best = min(timed, key=lambda e: e["us"], default=None)
        unfolded = {e["label"]: e for e in row["variants"]}.get(
            decode_groups.UNFOLDED, {}).get("vs_stock")
        entries[tuple(row["shape"])] = (row["activation"], best and best["vs_stock"], unfolded,
                                        best and best.get("config"))
    return _ratios_module(
        decode_gated_measured.__doc__, docs, command, commit,
        "(M, K, d_ff), activation, kernel / stock gain folded, unfolded; folded config",
        "tuple[tuple[int, int, int], str, float | None, float | None, dict[str, int | str] | None]",
        [f"({shape!r}, {act!r}, {_ratio(folded)}, {_ratio(unfolded)},\n     {config!r})"
         for shape, (act, folded, unfolded, config) in entries.items()])


def attention_table_source(docs: Sequence[dict[str, Any]], command: str, commit: str) -> str:
    """jaxnorm/backends/decode_attention_measured.py's text from bench/decode_attention_bench.py
    runs: per (M, K, q heads, kv heads, head_dim) the fastest folded kernel's ratio to stock
    less its slice kernels (`xla_slice_share`) (unsplit, or each head's K split in a
    cluster) and its config, and the unfolded kernel's ratio (None where a variant was not
    timed or not correct); later runs win."""
    from bench import decode_attention_bench as bench
    from jaxnorm.backends import decode_attention_measured

    entries: dict[bool, dict[tuple[int, ...], tuple]] = {True: {}, False: {}}
    for row in _gpu_rows(docs):
        shape, by_label = row["shape"], {e["label"]: e for e in row["variants"]}
        key = (row["m"], shape["d_model"], shape["n_heads"], shape["n_kv_heads"],
               shape["head_dim"])
        folded = [by_label[v] for v in (bench.KERNEL, bench.CLUSTER)
                  if "vs_stock" in by_label.get(v, {})]
        best = min(folded, key=lambda e: e["vs_stock"], default=None)
        unfolded = by_label.get(bench.UNFOLDED, {}).get("vs_stock")
        stock = by_label.get(bench.STOCK)  # its slice of v is left out
        # Runs before the Llama preset had QK-norm at every shape.
        entries[shape.get("qk_norm", True)][key] = (
            best and without_slices(best["vs_stock"], stock),
            unfolded and without_slices(unfolded, stock), best and best.get("config"))
    entry_type = ("tuple[tuple[int, int, int, int, int], float | None, float | None, "
                  "dict[str, int | str] | None]")

    def lines(qk_norm: bool) -> list[str]:
        return [f"({shape!r}, {_ratio(folded)}, {_ratio(unfolded)},\n     {config!r})"
                for shape, (folded, unfolded, config) in entries[qk_norm].items()]

    return _ratios_module(
        decode_attention_measured.__doc__, docs, command, commit,
        "(M, K, q heads, kv heads, head_dim), kernel / stock gain folded, unfolded; folded config",
        entry_type, lines(True),
        _table("The same without QK-norm (Llama: q and k only rotated).",
               "ENTRIES_WITHOUT_QK_NORM", entry_type, lines(False)))


def write_source(source: Callable[[Sequence[dict[str, Any]], str, str], str],
                 results: Sequence[Path], table: Path, *, command: str, commit: str) -> Path:
    """Write `source(runs' JSON, command, commit)` to `table`."""
    table.write_text(source([json.loads(p.read_text()) for p in results], command, commit))
    return table
