"""bench/gpu/check_kernels.py's CPU mode (SMOKE=1: the interpreter at small sizes) runs, judges
and reports: a few of its cases, one per kind of kernel and check, must pass, and the JSON
report must hold exactly those rows."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
# One pre-norm GEMM op, one standalone norm, one post-norm op with a residual, one with its
# output's statistics (and one at decode rows, through the decode GEMM), one decode gated shape,
# the kernel-level transport and GEMM-variant checks (the gain in the mainloop among them),
# RMSNorm's backward kernel (gain, alone, with the stream's cotangent, and with two and three
# consumers' cotangents summed in it), and the decode
# GEMM and gated kernel summing their K splits in a cluster.
ONLY = ["rms_norm 4x2048", "dense_rms_norm 64x64x256", "row_norm rms",
        "post_norm rms 128x64x512", "lazy GEMM: row statistics",
        "lazy GEMM: gain in the mainloop 4096", "layer_norm_dense 16x128x128",
        "residual-after stats dense_layer_norm", "residual-after stats dense_rms_norm 1x192",
        "decode gated silu 8x64x", "rms_norm_backward 8x512 gain",
        "decode GEMM cluster sum 8x256x(64) n128", "decode gated cluster gelu_tanh"]


def test_smoke_mode_passes_and_reports(tmp_path):
    env = {**os.environ, "SMOKE": "1", "OUT": str(tmp_path), "ONLY": ",".join(ONLY),
           "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, str(ROOT / "bench/gpu/check_kernels.py")], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "check_kernels.json").read_text())
    assert report["smoke"] and report["impl"] == "interpret"
    rows = report["rows"]
    statuses = {(r["check"], r["case"]): r["status"] for r in rows}
    # Every selected op case ran all three checks; each passed or (GPU-only) was skipped.
    for check in ("correct", "NaN isolated", "repeatable"):
        assert any(c == check and s == "pass" for (c, _), s in statuses.items()), check
    assert all(s in ("pass", "skip") for s in statuses.values()), statuses
    assert all(any(w in f"{c} {case}" for w in ONLY) for c, case in statuses)
    # Twelve op cases (with the decode ones, the backward kernel alone, with the stream's
    # cotangent added in it and with two and three cotangents, and the cluster sums), three
    # checks each; four kernel cases.
    assert len(rows) == 12 * 3 + 4, sorted(statuses)
    assert statuses["correct", "rms_norm_backward 8x512 gain + stream"] == "pass"
    assert statuses["correct", "rms_norm_backward 8x512 gain + stream, 3 cotangents"] == "pass"


def test_a_filter_that_matches_nothing_is_an_error(tmp_path):
    env = {**os.environ, "SMOKE": "1", "OUT": str(tmp_path), "ONLY": "no such kernel",
           "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, str(ROOT / "bench/gpu/check_kernels.py")], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    assert "matches no case label" in run.stderr
    assert not (tmp_path / "check_kernels.json").exists()
