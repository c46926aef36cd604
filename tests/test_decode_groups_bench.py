"""bench/decode_groups.py's code path on CPU (--smoke: a tiny shape under the interpreter):
every variant is checked before it is timed, and the JSON and Markdown hold it."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest

from bench import decode_groups, decode_table_writer


def test_smoke_run_checks_times_and_reports(tmp_path):
    args = ["--smoke", "--out", str(tmp_path), "--budget-s", "600", "--configs", "2"]
    assert decode_groups.main(args) == 0
    payload = json.loads((tmp_path / "decode-groups.json").read_text())
    assert payload["smoke"] and not payload["skipped"]
    (row,) = payload["rows"]
    assert row["shape"] == [8, 128, 192] and row["activation"] == "silu"
    labels = [e["label"] for e in row["variants"]]
    # Two kernel configs (the pick first), the kernel with the gain unfolded, two XLA baselines.
    assert labels[2:] == list(decode_groups.BASELINES) and len(labels) == 5
    pick = decode_groups.candidate_configs(8, 128, 192, 4)[0]
    assert row["variants"][0]["config"] == dataclasses.asdict(pick)
    for entry in row["variants"]:
        assert entry["correct"] and entry["us"] > 0
        assert entry["vs_stock"] == entry["us"] / row["variants"][3]["us"]
    assert all(e["err_tol"] <= 1.0 for e in row["variants"][:4])
    assert row["variants"][4]["error"] <= decode_groups.FLOOR_TOLERANCE
    assert "| 8x128x(192+192) | silu |" in (tmp_path / "decode-groups.md").read_text()
    with pytest.raises(ValueError, match="--smoke"):
        decode_table_writer.gated_table_source([payload], "cmd", "abc")


def test_the_table_module_holds_each_shapes_ratios():
    """--write-table: per shape the fastest kernel config's ratio to stock and its fields,
    and the unfolded kernel's ratio."""
    pick = dict(tile_n=64, tile_k=64, split_k=1, stages=8, warpgroups=1)
    split = dict(pick, tile_n=128, split_k=4, stages=3, reduction="cluster")
    variants = [dict(label="decode gated n64 st8", us=5.0, vs_stock=0.5, config=pick),
                dict(label="decode gated n128 st3 s4 cl", us=4.0, vs_stock=0.4, config=split),
                dict(label=decode_groups.UNFOLDED, vs_stock=0.75),
                dict(label=decode_groups.STOCK, vs_stock=1.0), dict(label=decode_groups.FLOOR)]
    doc = dict(environment=dict(date_utc="2026-12-01", devices=["NVIDIA H200"]), sms=132,
               rows=[dict(shape=[1, 1024, 3072], activation="silu", variants=variants),
                     dict(shape=[8, 1024, 3072], activation="gelu_tanh",
                          variants=variants[:1] + variants[3:])])
    namespace: dict = {}
    exec(decode_table_writer.gated_table_source([doc], "python -m bench.decode_groups", "abc"),
         namespace)
    assert namespace["PROVENANCE"]["sms"] == 132 and namespace["PROVENANCE"]["commit"] == "abc"
    assert namespace["ENTRIES"] == (((1, 1024, 3072), "silu", 0.4, 0.75, split),
                                    ((8, 1024, 3072), "gelu_tanh", 0.5, None, pick))


def test_a_wrong_floor_is_caught_by_the_check():
    """The floor's check fails a result off by more than bf16 rounding."""
    key = jax.random.key(0)
    x, _, wg, wu = decode_groups._inputs(key, 4, 64, 64)
    right = jax.nn.silu(x @ wg) * (x @ wu)
    assert decode_groups.floor_error(right, x, wg, wu, "silu") <= decode_groups.FLOOR_TOLERANCE
    wrong = right.at[1, 3].add(jnp.asarray(0.5, right.dtype))
    assert decode_groups.floor_error(wrong, x, wg, wu, "silu") > decode_groups.FLOOR_TOLERANCE


def test_a_wrong_kernel_is_reported_not_timed():
    """A variant whose output the float64 judge rejects is marked wrong (never timed)."""
    first = decode_groups._inputs(jax.random.key(1), 4, 64, 64)
    entry = decode_groups.check("decode gated wrong", lambda x, g, wg, wu: x @ wg, first, "silu")
    assert not entry["correct"] and "failure" in entry


def test_candidates_are_distinct_and_start_with_the_pick():
    configs = decode_groups.candidate_configs(1, 4096, 14336, 132)
    assert configs[0] == decode_groups.dc.gated_decode_config(1, 4096, 14336, sms=132)
    assert len(set(configs)) == len(configs) >= 3


def test_shape_filter_picks_listed_shapes_and_refuses_unknown_ones():
    assert decode_groups._shape_filter("1152x6912,1024X3072") == {(1152, 6912), (1024, 3072)}
    for bad in ("1152x6913", "1152", "axb"):
        with pytest.raises(Exception, match="1152x6912"):
            decode_groups._shape_filter(bad)
