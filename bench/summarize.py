"""Summaries of published results: `python -m bench.summarize [--check] FOLDER [FOLDER ...]`.

A folder of bench/results holds `manifest.json` (what was measured: GPU,
driver, jax, and per run its commit, command and files) and the raw files it
names. This writes the folder's `summary.md` from those alone: the manifest,
then every JSON file as tables (bench suites as `python -m bench` prints them,
the GPU scripts' items with their configs listed once), and for the norm-gemm
sweep, split over several invocations, one table across them. `--check` only
compares, and fails where a summary is stale. Logs (.txt, .csv) are listed,
not summarised.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench import report

MANIFEST = "manifest.json"
SUMMARY = "summary.md"
MANIFEST_KEYS = ("title", "claims", "gpu", "driver", "jax", "runs")
RUN_KEYS = ("files", "commit", "command")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    return str(value).replace("|", "\\|")


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None or (
        isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value))


def records_table(records: list[dict[str, Any]]) -> list[str]:
    """A Markdown table of flat records; long `config` strings become numbered footnotes."""
    columns: list[str] = []
    for record in records:
        columns += [k for k, v in record.items() if k not in columns and _scalar(v)]
    configs: list[str] = []
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for record in records:
        cells = []
        for key in columns:
            value = record.get(key, "")
            if key == "config" and value:
                if value not in configs:
                    configs.append(value)
                value = f"[{configs.index(value) + 1}]"
            cells.append(_cell(value))
        lines.append("| " + " | ".join(cells) + " |")
    if configs:
        lines += ["", *(f"[{i}] `{c}`  " for i, c in enumerate(configs, 1))]
    return lines


def norm_gemm_table(payloads: Iterable[dict[str, Any]]) -> str:
    """Per shape of norm-gemm sweeps: the fused kernel against our plain GEMM and XLA."""
    by_shape: dict[tuple[int, int, tuple[int, ...]], dict[str, Any]] = {}
    ceilings: dict[tuple[int, int, tuple[int, ...]], dict[str, Any]] = {}
    for payload in payloads:
        for row in payload["rows"]:
            if row["status"] == "ok":
                key = (row["k"], row["m"], tuple(row["ns"]))
                by_shape.setdefault(key, {})[row["impl"]] = row
                ceilings[key] = payload["ceilings"]
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
        rate = 2 * k * sum(ns) / (t["jaxnorm"] * 1e-6) / 1e12
        pct = 100 * rate * 1e12 / ceilings[(k, m, ns)]["hbm_bytes_per_s"]
        n = "+".join(map(str, ns))
        lines.append(
            f"| {m}x{k}x{n} | {t['xla']:.1f} | {t['xla-dot']:.1f} | {t['plain-gemm']:.1f} | "
            f"{t['jaxnorm']:.1f} | {t['jaxnorm'] / t['plain-gemm']:.3f} | "
            f"{t['jaxnorm'] / t['xla']:.3f} | {hidden:.2f} | {rate:.2f} | {pct:.0f} |"
        )
    return "\n".join(lines)


def _suite_section(payload: dict[str, Any]) -> list[str]:
    env, ceilings = payload["env"], payload["ceilings"]
    lines = [
        f"`python -m bench` suite `{payload['suite']}`, {env['date_utc']}, {env['devices']}, "
        f"driver {env['driver']}, jax {env['jax']}. Ceilings measured in the same run: HBM "
        f"copy {ceilings['hbm_bytes_per_s'] / 1e12:.3f} TB/s, bf16 GEMM "
        f"{ceilings['gemm_flops_per_s'] / 1e12:.1f} TFLOP/s. Medians; kernel = CUPTI kernel "
        "time, wall = per call with launch.",
        "",
        report.to_markdown(report.results_table(payload["suite"], payload["rows"])),
    ]
    hidden = report.hidden_fractions(payload["rows"])
    if hidden:
        table = report.TextTable(
            "share of XLA's separate-norm time hidden",
            ["case", "(t_xla - t_jaxnorm) / (t_xla - t_xla_dot)"],
            [[name, report.fmt(v, 2)] for name, v in hidden.items()])
        lines += ["", report.to_markdown(table)]
    return lines


def _json_section(payload: Any) -> list[str]:
    """Tables for one JSON file: a bench suite, GPU-script sections of items, or records."""
    if isinstance(payload, dict) and "suite" in payload and "rows" in payload:
        return _suite_section(payload)
    if isinstance(payload, dict) and "cells" in payload and "variants" in payload:  # model suite
        from bench import model_suite

        return [model_suite.to_markdown(model_suite.from_json(payload),
                                        breakdown=payload.get("breakdown") is not None,
                                        skipped=payload.get("skipped", ()))]
    if isinstance(payload, dict) and isinstance(payload.get("rows"), list) and payload["rows"] \
            and {"preset", "m", "variants"} <= set(payload["rows"][0]):  # decode_attention_bench
        from bench import decode_attention_bench

        return [report.to_markdown(decode_attention_bench.table(payload["rows"]))]
    if isinstance(payload, list):
        return records_table(payload)
    header = {k: v for k, v in payload.items() if _scalar(v)}
    lines = [", ".join(f"{k}: {_cell(v)}" for k, v in header.items())] if header else []
    sections = {k: v for k, v in payload.items() if isinstance(v, dict)}
    if all("items" in v for v in sections.values()):
        for name, section in sections.items():
            lines += ["", f"#### {name}", "", *records_table(section["items"])]
    elif all(v and all(isinstance(r, dict) for r in v.values()) for v in sections.values()):
        for name, section in sections.items():  # each a record per key
            lines += ["", f"#### {name}", "",
                      *records_table([{"name": k, **r} for k, r in section.items()])]
    else:  # a record per key
        lines += ["", *records_table([{"name": k, **v} for k, v in sections.items()])]
    for name, records in payload.items():  # lists of records: one table each
        if isinstance(records, list) and records and all(isinstance(r, dict) for r in records):
            lines += ["", f"#### {name}", "", *records_table(records)]
    return lines


def check_manifest(manifest: dict[str, Any], folder: Path) -> None:
    """Every field present, and every file a run names exists in the folder."""
    missing = [k for k in MANIFEST_KEYS if k not in manifest]
    missing += [f"runs[{i}].{k}" for i, run in enumerate(manifest.get("runs", []))
                for k in RUN_KEYS if k not in run]
    if missing:
        raise ValueError(f"{folder / MANIFEST}: missing {missing}")
    absent = [f for run in manifest["runs"] for f in run["files"] if not (folder / f).is_file()]
    if absent:
        raise ValueError(f"{folder / MANIFEST}: files not in the folder: {absent}")


def summary(folder: Path) -> str:
    """summary.md's text for one results folder."""
    manifest = json.loads((folder / MANIFEST).read_text())
    check_manifest(manifest, folder)
    lines = [
        f"# {manifest['title']}",
        "",
        f"Generated by `python -m bench.summarize bench/results/{folder.name}` from "
        f"`{MANIFEST}` and the raw files; do not edit.",
        "",
        manifest["claims"],
        "",
        f"- GPU: {manifest['gpu']}; driver: {manifest['driver']}; jax: {manifest['jax']}",
        "",
        "| files | commit | command |",
        "|---|---|---|",
    ]
    for run in manifest["runs"]:
        files = ", ".join(f"`{f}`" for f in run["files"])
        lines.append(f"| {files} | {run['commit']} | `{_cell(run['command'])}` |")
    files = [f for run in manifest["runs"] for f in run["files"]]
    payloads = {f: json.loads((folder / f).read_text()) for f in files if f.endswith(".json")}
    sweeps = [p for p in payloads.values()
              if isinstance(p, dict) and p.get("suite") == "norm-gemm"]
    if len(sweeps) > 1:
        lines += ["", "## norm-gemm, every invocation", "", norm_gemm_table(sweeps)]
    for name, payload in payloads.items():
        lines += ["", f"## {name}", "", *_json_section(payload)]
    logs = [f for f in files if not f.endswith(".json")]
    if logs:
        lines += ["", "## Logs (raw, not summarised)", ""]
        lines += [f"- `{f}`: {len((folder / f).read_text().splitlines())} lines" for f in logs]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.summarize", description=__doc__)
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="fail where summary.md is stale")
    args = parser.parse_args(argv)
    stale = []
    for folder in args.folders:
        text, path = summary(folder), folder / SUMMARY
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"stale (run python -m bench.summarize on them): {stale}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
