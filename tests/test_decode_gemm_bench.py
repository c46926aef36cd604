"""bench/decode_gemm.py's code path on CPU (--smoke: a tiny shape under the interpreter):
every config is checked against XLA before it is timed, and the JSON and Markdown hold it."""

from __future__ import annotations

import json

import jax.numpy as jnp

from bench import decode_gemm
from pallas_kernels import decode_configs, hardware


def test_smoke_run_checks_times_and_reports(tmp_path):
    args = ["--smoke", "--out", str(tmp_path), "--budget-s", "600", "--configs", "2"]
    assert decode_gemm.main(args) == 0
    payload = json.loads((tmp_path / "decode-gemm.json").read_text())
    assert payload["smoke"] and payload["copy_tb_s"] > 0 and not payload["skipped"]
    row, pair = payload["rows"]
    assert row["shape"] == [8, 128, 192] and row["ns"] == [192] and row["xla"]["us"] > 0
    assert pair["ns"] == [128, 64] and pair["configs"][0]["correct"]
    # The pick, then one alternative, each pass against its own cuBLAS measurement.
    assert len(row["configs"]) == 2 and set(row["xla_by_phase"]) == {"pick", "alternatives"}
    for entry in row["configs"]:
        assert entry["correct"] and entry["error"] <= decode_gemm.TOLERANCE
        assert entry["ratio"] == entry["us"] / row["xla_by_phase"][entry["phase"]]["us"]
    assert row["best"] in {e["label"] for e in row["configs"]}
    markdown = (tmp_path / "decode-gemm.md").read_text()
    assert "| 8x128x192 |" in markdown and "| 8x128x(128+64) |" in markdown


def test_a_wrong_result_is_caught_by_the_check():
    """The correctness gate fails a result that is off by more than bf16 rounding."""
    x = jnp.asarray([[1.0, 2.0], [3.0, -1.0]], jnp.bfloat16)
    w = jnp.asarray([[0.5, -1.0], [2.0, 0.25]], jnp.bfloat16)
    r = jnp.asarray([1.0, 0.5], jnp.float32)
    right = (jnp.dot(x, w, preferred_element_type=jnp.float32) * r[:, None]).astype(jnp.bfloat16)
    assert decode_gemm.worst_error([right], x, [w], r) <= decode_gemm.TOLERANCE
    assert decode_gemm.worst_error([right.at[1, 0].add(0.25)], x, [w], r) > decode_gemm.TOLERANCE


def test_candidates_are_distinct_and_start_with_the_pick():
    configs = decode_gemm.candidate_configs(1, 4096, (6144,), 132)
    assert configs[0] == decode_gemm.dm.decode_config(1, 4096, (6144,), sms=132)
    assert len(set(configs)) == len(configs) >= 3


def test_losing_launches_are_the_tables_losses_at_the_rows_asked():
    rows = (1, 8)
    losing = decode_gemm.losing_launches(rows)
    ratios = {shape: ratio for shape, _, ratio in decode_configs.ENTRIES}
    expected = {shape for shape, ratio in ratios.items() if ratio > 1.0 and shape[0] in rows}
    assert set(losing) == expected and expected
    assert [ratios[s] for s in losing] == sorted((ratios[s] for s in losing), reverse=True)


def test_cluster_candidates_keep_every_tiles_cluster_resident():
    """A cluster per tile that waits for another to finish runs the launch in two rounds:
    each cluster candidate's tiles fit the H200's resident clusters at its width."""
    for m, k, ns in [(8, 8192, (2048,)), (8, 2048, (1024,)), (1, 2048, (2048, 512, 512))]:
        clustered = [c for c in decode_gemm.candidate_configs(m, k, ns, 132) if c.cluster_splits]
        assert clustered
        for c in clustered:
            tiles = sum(-(-n // c.tile_n) for n in ns)
            assert tiles <= hardware.resident_clusters(c.split_k, 132)
            assert c.split_k == 8 or tiles > hardware.resident_clusters(c.split_k + 1, 132)
    # 32 tiles of 64 columns: 30 clusters of 4 are resident on the H200, 43 of 3.
    assert decode_gemm.dc.one_wave_cluster_split(32, 128, 132) == 3
    assert decode_gemm.dc.one_wave_cluster_split(200, 128, 132) is None
