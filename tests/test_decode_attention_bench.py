"""bench/decode_attention_bench.py's code path on CPU (--smoke: a tiny preset under the
interpreter): every variant is checked before it is timed, and the JSON and Markdown hold it."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from bench import decode_attention_bench as dab


def test_smoke_run_checks_times_and_reports(tmp_path):
    assert dab.main(["--smoke", "--out", str(tmp_path), "--budget-s", "600"]) == 0
    payload = json.loads((tmp_path / "decode-attention.json").read_text())
    assert payload["smoke"] and not payload["skipped"]
    (row,) = payload["rows"]
    assert row["preset"] == "smoke" and row["m"] == 8
    labels = [e["label"] for e in row["variants"]]
    assert labels == [dab.KERNEL, dab.UNFOLDED, dab.STOCK, dab.FLOOR]
    for entry in row["variants"]:
        assert entry["correct"] and entry["us"] > 0
        assert entry["vs_stock"] == entry["us"] / row["variants"][2]["us"]
    assert all(e["err_tol"] <= 1.0 for e in row["variants"][:3])
    assert row["variants"][0]["config"]["tile_n"] == 64
    assert row["variants"][3]["error"] <= dab.FLOOR_TOLERANCE
    assert "| smoke | 8 |" in (tmp_path / "decode-attention.md").read_text()


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
