"""bench/gated_bench.py's CPU mode (--smoke: the interpreter at a tiny shape) runs every
variant, checks the kernel against the stock output and writes its report."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import gated_bench
from bench.shapes import parse_mkn


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


def test_gelu_smoke_labels_its_floor_and_records_the_activation(tmp_path):
    gated_bench.main(["--smoke", "--activation", "gelu_tanh", "--rounds", "1", "--repeats",
                      "1", "--warmup", "0", "--out", str(tmp_path)])
    (row,) = json.loads((tmp_path / "gated-bench.json").read_text())["rows"]
    assert row["activation"] == "gelu_tanh" and row["max_rel_diff_vs_stock"] < 2**-5
    assert "two dots + gelu_tanh*up" in row["wall_us"]


def test_shapes_option_parses_and_rejects():
    assert parse_mkn("8192x1152x6912,4x8x16") == ((8192, 1152, 6912), (4, 8, 16))
    for bad in ("8192x1152", "ax2x3", "0x2x3", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_mkn(bad)
