"""bench/decode_attention_bench.py's code path on CPU (--smoke: a tiny preset under the
interpreter): every variant is checked before it is timed, and the JSON and Markdown hold it."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from bench import decode_attention_bench as dab
from bench import decode_table_writer


def test_smoke_run_checks_times_and_reports(tmp_path):
    assert dab.main(["--smoke", "--out", str(tmp_path), "--budget-s", "600"]) == 0
    payload = json.loads((tmp_path / "decode-attention.json").read_text())
    assert payload["smoke"] and not payload["skipped"]
    assert [(r["preset"], r["m"], r["shape"]["qk_norm"]) for r in payload["rows"]] == [
        ("smoke", 8, True), ("smoke-llama", 8, False)]
    for row in payload["rows"]:
        by_label = {e["label"]: e for e in row["variants"]}
        # The K split in a cluster of 2, the interpreter's widest.
        assert list(by_label) == [dab.KERNEL, dab.UNFOLDED, dab.CLUSTER, dab.STOCK, dab.FLOOR]
        for entry in row["variants"]:
            assert entry["correct"] and entry["us"] > 0
            assert entry["vs_stock"] == entry["us"] / by_label[dab.STOCK]["us"]
        assert all(by_label[v]["err_tol"] <= 1.0 for v in (dab.KERNEL, dab.UNFOLDED,
                                                            dab.CLUSTER, dab.STOCK))
        assert by_label[dab.KERNEL]["config"]["tile_n"] == 64
        assert by_label[dab.CLUSTER]["config"]["split_k"] == 2
        assert by_label[dab.FLOOR]["error"] <= dab.FLOOR_TOLERANCE
    assert "| smoke-llama | 8 |" in (tmp_path / "decode-attention.md").read_text()


@pytest.mark.parametrize("preset", dab.PRESETS, ids=lambda p: p.name)
def test_stock_matches_the_float64_attention_input(preset):
    """The baseline is what it claims: the stock convention within verify.rope's judge (a
    shrunk preset: d_model 256, the preset's heads and head_dim)."""
    p = preset._replace(d_model=256)
    a = dab.inputs(jax.random.key(3), 4, p)
    outs = jax.jit(dab.stock, static_argnums=1)(a, p)
    assert dab.judge(dab.STOCK, outs, a, p)["err_tol"] <= 1.0
    # RoPE moved the values: q is not the unrotated QK-norm output.
    unrotated = dab.stock(a._replace(positions=0 * a.positions), p)[0]
    assert not np.allclose(np.asarray(outs[0], np.float32), np.asarray(unrotated, np.float32))


def test_the_table_module_holds_each_shapes_ratios():
    """--write-table: per (M, K, heads, kv heads, head_dim) the fastest folded kernel's ratio to
    stock and config, and the unfolded kernel's ratio, None where a variant was not timed; a
    later run's row of one shape wins; rows without QK-norm (Llama) in their own table (runs
    before that field: QK-norm)."""
    shape = dict(name="qwen3-0.6b", d_model=1024, n_heads=16, n_kv_heads=8, head_dim=128)
    one = dict(tile_n=64, tile_k=64, split_k=1, stages=7, warpgroups=1)
    split = dict(one, split_k=4, stages=3, reduction="cluster")
    timed = [dict(label=dab.KERNEL, vs_stock=0.4, config=one),
             dict(label=dab.UNFOLDED, vs_stock=0.45, config=one),
             dict(label=dab.STOCK, vs_stock=1.0)]
    env = dict(date_utc="2026-12-02", devices=["NVIDIA H200"])
    first = dict(environment=env, sms=132, rows=[dict(preset="q", m=1, shape=shape,
                                                      variants=timed)])
    later = dict(environment=env, sms=132, rows=[
        dict(preset="q", m=1, shape=shape, variants=[dict(timed[0], vs_stock=0.39)]),
        dict(preset="q", m=8, shape=shape, variants=timed)])
    namespace: dict = {}
    exec(decode_table_writer.attention_table_source([first, later], "cmd", "abc"), namespace)
    assert namespace["PROVENANCE"]["commit"] == "abc" and namespace["PROVENANCE"]["sms"] == 132
    assert namespace["ENTRIES"] == (((1, 1024, 16, 8, 128), 0.39, None, one),
                                    ((8, 1024, 16, 8, 128), 0.4, 0.45, one))
    assert namespace["ENTRIES_WITHOUT_QK_NORM"] == ()
    llama = dict(shape, name="llama3-8b", d_model=4096, n_heads=32, qk_norm=False)
    runs = [first, dict(later, rows=[dict(preset="l", m=1, shape=llama, variants=timed)])]
    namespace = {}
    exec(decode_table_writer.attention_table_source(runs, "cmd", "abc"), namespace)
    assert namespace["ENTRIES"] == (((1, 1024, 16, 8, 128), 0.4, 0.45, one),)
    assert namespace["ENTRIES_WITHOUT_QK_NORM"] == (((1, 4096, 32, 8, 128), 0.4, 0.45, one),)
    # A faster K split in a cluster is the folded entry: its ratio and config.
    runs = [dict(first, rows=[dict(preset="q", m=8, shape=shape, variants=timed + [
        dict(label=dab.CLUSTER, vs_stock=0.3, config=split)])])]
    namespace = {}
    exec(decode_table_writer.attention_table_source(runs, "cmd", "abc"), namespace)
    assert namespace["ENTRIES"] == (((8, 1024, 16, 8, 128), 0.3, 0.45, split),)
    # Stock's slice kernel (v returned as it is) is left out: a model fuses it away.
    sliced = [*timed[:2], dict(timed[2], kernels=[["gemm_fusion_dot", 7.5],
                                                  ["wrapped_slice", 2.5]])]
    namespace = {}
    exec(decode_table_writer.attention_table_source(
        [dict(first, rows=[dict(preset="q", m=8, shape=shape, variants=sliced)])], "cmd", "abc"),
        namespace)
    ((_, folded, unfolded, _),) = namespace["ENTRIES"]
    assert (folded, unfolded) == (pytest.approx(0.4 / 0.75, abs=1e-3),
                                  pytest.approx(0.45 / 0.75, abs=1e-3))
    with pytest.raises(ValueError, match="--smoke"):
        decode_table_writer.attention_table_source([dict(first, smoke=True)], "cmd", "abc")
