"""bench/gated_bench.py's CPU mode (--smoke: the interpreter at a tiny shape) runs every
variant, checks the kernel against the stock output and writes its report."""

from __future__ import annotations

import json

from bench import gated_bench


def test_smoke_mode_times_every_variant_and_reports(tmp_path):
    gated_bench.main(["--smoke", "--rounds", "1", "--repeats", "1", "--warmup", "0",
                      "--out", str(tmp_path)])
    report = json.loads((tmp_path / "gated-bench.json").read_text())
    (row,) = report["rows"]
    assert report["impl"] == "interpret" and row["shape"] == "130x128x(192+192)"
    assert row["max_rel_diff_vs_stock"] < 2**-5  # bf16 outputs of the same values
    assert set(row["wall_us"]) == {"gated kernel", "stock", "gated kernel, folded",
                                   "two dots + silu*up"}
    assert all(t > 0 for t in row["wall_us"].values())
