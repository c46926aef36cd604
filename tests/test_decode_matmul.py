"""The decode GEMM (M <= 64, split-K) under the Mosaic GPU interpreter with race detection.

Outputs are judged by verify's float64 reference of RMSNorm(x) @ W + b; uninitialized
memory reads as NaN in the interpreter, so an element no unit writes fails the check.
Weights are q/k/v-like (one wide, two narrow), 192 columns is not a whole number of
128-column tiles (a piece past N is skipped), K = 256 is four K steps (split 1, 2, 4 ways).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm.backends import mosaic_dense
from kernel_checks import assert_race_free
from bench import decode_table_writer
from pallas_kernels import decode_config as dc
from pallas_kernels import decode_configs
from pallas_kernels import decode_matmul as dm
from pallas_kernels.errors import Unsupported
from pallas_kernels.lazy_norm_matmul import rms_row_scale
from verify.checks import check_op, check_outputs

BF16 = jnp.bfloat16
QKV = (192, 64, 64)


def _inputs(rng, m: int, k: int, ns, *, bias=True, gain=False, dtype=BF16) -> dict:
    inputs = dict(
        x=jnp.asarray(rng.standard_normal((m, k)) + 0.3, dtype),
        kernel=[jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), dtype) for n in ns],
        bias=[jnp.asarray(rng.standard_normal(n), jnp.float32) if bias and i != 1 else None
              for i, n in enumerate(ns)],
        eps=1e-6,
    )
    if gain:
        inputs["scale"] = jnp.asarray(0.2 * rng.standard_normal(k), jnp.float32)
        inputs["scale_offset"] = 1.0
    return inputs


# (M, split_k, tile_n, warpgroups, reduction): every M of the issue, every split, both
# warpgroup counts, the splits summed by XLA; then summed in a cluster of 2 CTAs (the
# interpreter's widest; through global scratch there, DSMEM on the GPU), where two clusters
# walk the tiles, so each exchanges several times and a buffer is reused only once read.
CASES = [
    (1, 1, 128, 1, "xla"),
    (1, 4, 64, 1, "xla"),
    (7, 2, 128, 1, "xla"),
    (7, 1, 64, 2, "xla"),
    (16, 4, 128, 1, "xla"),
    (16, 2, 64, 2, "xla"),
    (64, 1, 64, 1, "xla"),
    (64, 4, 64, 2, "xla"),
    (1, 2, 64, 1, "cluster"),
    (7, 2, 128, 1, "cluster"),
    (16, 2, 64, 2, "cluster"),
    (64, 2, 128, 1, "cluster"),
]


@pytest.mark.parametrize("m, split_k, tile_n, warpgroups, reduction", CASES)
def test_decode_matmul_matches_reference(m, split_k, tile_n, warpgroups, reduction, rng):
    inputs = _inputs(rng, m, 256, QKV)
    config = dc.DecodeConfig(tile_n=tile_n, split_k=split_k, stages=3, warpgroups=warpgroups,
                             reduction=reduction)
    outs = dm.lazy_rms_decode_matmul(
        inputs["x"], inputs["kernel"], row_scale=rms_row_scale(inputs["x"], inputs["eps"]),
        biases=inputs["bias"], config=config, interpret=True)
    assert_race_free()
    assert all(y.dtype == BF16 and y.shape == (m, n) for y, n in zip(outs, QKV))
    assert check_outputs("rms_norm_dense", outs, **inputs) <= 1.0


def test_cluster_reduction_is_one_kernel():
    """The sum of the splits is in the kernel: no XLA reduction after it, unlike "xla"."""
    x, w, r = jnp.ones((8, 256), BF16), jnp.ones((256, 128), BF16), jnp.ones((8,))

    def reductions(reduction: str) -> int:
        config = dc.DecodeConfig(tile_n=64, split_k=2, stages=3, reduction=reduction)

        def fn(x, w, r):
            return dm.lazy_rms_decode_matmul(x, [w], row_scale=r, config=config, interpret=True)

        return str(jax.make_jaxpr(fn)(x, w, r)).count("reduce_sum")

    assert reductions("cluster") == 0 and reductions("xla") == 1


# (M, split_k, tile_n, warpgroups): split_k = 1 takes the statistic from the x tiles in the
# kernel; split_k = 2 from one XLA row reduction.
# With reduction="cluster" (split 2), each split sums its share of the squares and rank 0 adds
# them with the partials: no XLA reduction either.
STATISTIC_CASES = [(1, 1, 128, 1, "xla"), (7, 1, 64, 2, "xla"), (16, 2, 64, 1, "xla"),
                   (64, 1, 64, 1, "xla"), (1, 2, 64, 1, "cluster"), (7, 2, 64, 2, "cluster"),
                   (64, 2, 128, 1, "cluster")]


@pytest.mark.parametrize("m, split_k, tile_n, warpgroups, reduction", STATISTIC_CASES)
def test_row_statistic_when_no_row_scale_is_given(m, split_k, tile_n, warpgroups, reduction,
                                                  rng, monkeypatch):
    reductions = []
    original = dm.rms_row_scale
    monkeypatch.setattr(dm, "rms_row_scale", lambda *a: reductions.append(1) or original(*a))
    inputs = _inputs(rng, m, 256, QKV)
    config = dc.DecodeConfig(tile_n=tile_n, split_k=split_k, stages=3, warpgroups=warpgroups,
                             reduction=reduction)
    outs = dm.lazy_rms_decode_matmul(inputs["x"], inputs["kernel"], eps=inputs["eps"],
                                     biases=inputs["bias"], config=config, interpret=True)
    assert_race_free()
    assert check_outputs("rms_norm_dense", outs, **inputs) <= 1.0
    assert reductions == ([1] if config.partials_out else [])


@pytest.mark.parametrize("in_kernel", [False, True])
def test_op_path_takes_the_statistic_in_xla_unless_asked(in_kernel, rng, monkeypatch):
    """decode_rms_norm_dense without a gain: the XLA row statistic (measured in decode steps)
    by default, the kernel's when asked; both against float64."""
    reductions = []
    original = dm.rms_row_scale
    monkeypatch.setattr(dm, "rms_row_scale", lambda *a: reductions.append(1) or original(*a))
    inputs = _inputs(rng, 5, 256, QKV)
    config = dc.DecodeConfig(tile_n=128, split_k=1, stages=3)
    outs = dm.decode_rms_norm_dense(
        inputs["x"], inputs["kernel"], eps=inputs["eps"], scale=None, scale_offset=0.0,
        biases=inputs["bias"], config=config, interpret=True, in_kernel_statistic=in_kernel)
    assert_race_free()
    assert check_outputs("rms_norm_dense", outs, **inputs) <= 1.0
    assert bool(reductions) is not in_kernel


@pytest.mark.parametrize("m, split_k, dtype", [(3, 1, jnp.float16), (13, 2, BF16)])
def test_gain_folded_into_x_without_biases(m, split_k, dtype, rng):
    """Gemma's (1 + g) gain scales x; no bias vectors; M = 13 pads x to 16 rows for TMA."""
    inputs = _inputs(rng, m, 192, (128, 64), bias=False, gain=True, dtype=dtype)
    config = dc.DecodeConfig(tile_n=64, split_k=split_k, stages=2)
    outs = dm.decode_rms_norm_dense(
        inputs["x"], inputs["kernel"], eps=inputs["eps"], scale=inputs["scale"],
        scale_offset=1.0, biases=None, config=config, interpret=True)
    assert_race_free()
    assert check_outputs("rms_norm_dense", outs, **inputs) <= 1.0


def test_op_serves_decode_rows_with_the_decode_kernel(rng, monkeypatch):
    """jaxnorm's rms_norm_dense (impl="interpret") at M <= 64 runs the decode kernel."""
    calls = []
    original = dm.lazy_rms_decode_matmul
    monkeypatch.setattr(dm, "lazy_rms_decode_matmul", lambda *a, **kw: calls.append(1)
                        or original(*a, **kw))
    inputs = _inputs(rng, 5, 128, QKV, gain=True)
    assert check_op("rms_norm_dense", "interpret", **inputs) <= 1.0
    assert_race_free()
    assert calls


def _decline(m: int, k: int, ns: tuple[int, ...]) -> str | None:
    s = jax.ShapeDtypeStruct
    kernels = tuple(s((k, n), BF16) for n in ns)
    return mosaic_dense._decline_rms_norm_dense(s((m, k), BF16), None, kernels, (None,) * len(ns))


def test_automatic_dispatch_follows_the_measured_table():
    """Used where the nearest measured launch ran at or under DECODE_MAX_RATIO of stock's dots,
    declined with the figure above it, declined as unmeasured far from every measured launch."""
    faster = [e for e in decode_configs.ENTRIES if e[2] <= mosaic_dense.DECODE_MAX_RATIO]
    slower = [e for e in decode_configs.ENTRIES if e[2] > mosaic_dense.DECODE_MAX_RATIO]
    assert faster and slower
    for (m, k, ns), _, _ in faster:
        assert _decline(m, k, ns) is None
    for (m, k, ns), _, ratio in slower:
        reason = _decline(m, k, ns)
        assert f"{ratio:.3f}x cuBLAS" in reason and "impl='mosaic'" in reason
    assert "no measured shape nearby" in _decline(4, 256, (256,))


def _table(monkeypatch, *entries) -> None:
    monkeypatch.setattr(decode_configs, "ENTRIES", entries)
    monkeypatch.setattr(decode_configs, "PROVENANCE", {"sms": 132})


def test_table_entry_serves_nearby_launches_and_the_model_the_rest(monkeypatch):
    fields = dict(tile_n=128, tile_k=64, split_k=2, stages=8, warpgroups=1)
    _table(monkeypatch, ((1, 2048, (3072,)), fields, 0.9))
    assert dm.decode_config(1, 2048, (3072,)) == dc.DecodeConfig(**fields)
    # Within a factor of 2 in M; N split over several weights.
    entry = dc.measured_entry(2, 2048, (2048, 512, 512), sms=132)
    assert entry.config == dc.DecodeConfig(**fields) and entry.ratio_to_cublas == 0.9
    # M = 8 against an M = 1 entry: cuBLAS runs another algorithm there; not served.
    assert dc.measured_entry(8, 2048, (3072,), sms=132) is None
    assert dc.measured_entry(1, 2048, (3072,), sms=100) is None  # another GPU's table
    assert dm.decode_config(4, 256, (256,)) == dc._decode_config(4, 256, (256,), 132, 2)


def test_entries_of_more_weights_do_not_serve_fewer(monkeypatch):
    """An entry's ratio is against one dot per weight: a q/k/v entry does not speak for one
    weight; a one-weight entry may for q/k/v, and the same count wins when both are near."""
    one = dict(tile_n=64, tile_k=64, split_k=1, stages=12, warpgroups=1)
    three = dict(tile_n=128, tile_k=64, split_k=1, stages=8, warpgroups=1)
    _table(monkeypatch, ((1, 2048, (3072,)), one, 1.1), ((1, 2048, (2048, 512, 512)), three, 0.5))
    assert dc.measured_entry(1, 2048, (3072,), sms=132).ratio_to_cublas == 1.1
    assert dc.measured_entry(1, 2048, (2048, 512, 512), sms=132).ratio_to_cublas == 0.5
    _table(monkeypatch, ((1, 2048, (2048, 512, 512)), three, 0.5))
    assert dc.measured_entry(1, 2048, (3072,), sms=132) is None


def test_table_writer_round_trips_runs(tmp_path):
    def run(ns, ratio):
        return dict(smoke=False, sms=132, rows=[dict(
            shape=[1, 512, sum(ns)], ns=ns, best="n64 s2 st12", ratio=ratio,
            configs=[dict(label="n64 s2 st12", config=dict(tile_n=64, tile_k=64, split_k=2,
                                                            stages=12, warpgroups=1))])],
            environment=dict(date_utc="2026-12-01T00:00:00+00:00", devices=["NVIDIA H200"]))

    docs = [run([1024], 0.95), run([512, 512], 0.6), run([1024], 0.97)]
    # cuBLAS's side of the two-weight launch: one merged GEMM, two slices (a third of it).
    docs[1]["rows"][0]["xla"] = dict(us=9.0, kernels=[["gemm_fusion_dot", 6.0],
                                                      ["loop_slice_fusion", 1.5],
                                                      ["loop_slice_fusion_1", 1.5]])
    source = decode_table_writer.table_source(docs, "python -m bench.decode_gemm", "abc1234")
    namespace: dict = {}
    exec(compile(source, "decode_configs.py", "exec"), namespace)
    assert namespace["PROVENANCE"]["commit"] == "abc1234"
    config = docs[0]["rows"][0]["configs"][0]["config"]
    # The later run's measurement of a launch replaces the earlier one; the two-weight
    # launch's ratio is to the GEMM alone (0.6 * 9 / 6), as a model pays it.
    assert namespace["ENTRIES"] == (((1, 512, (1024,)), config, 0.97),
                                    ((1, 512, (512, 512)), config, 0.9))
    with pytest.raises(ValueError, match="smoke"):
        decode_table_writer.table_source([dict(docs[0], smoke=True)], "", "")


@pytest.mark.parametrize("m", [1, 8, 16, 64])
@pytest.mark.parametrize("k, ns", [(4096, (6144,)), (8192, (2048,)), (2048, (128256,)),
                                   (2048, (2048, 512, 512)), (4096, (14336, 14336))])
def test_modelled_pick_is_valid_and_no_slower_than_its_alternatives_in_the_model(m, k, ns):
    config = dc._decode_config(m, k, tuple(ns), 132, 2)
    dc.check_shapes(jax.ShapeDtypeStruct((m, k), BF16),
                    [jax.ShapeDtypeStruct((k, n), BF16) for n in ns], config)
    picked = dc.modelled_seconds(config, m, k, ns, sms=132)
    for other in (dc.DecodeConfig(tile_n=64, stages=12), dc.DecodeConfig(split_k=4)):
        assert picked <= 1.001 * dc.modelled_seconds(other, m, k, ns, sms=132)
    # The model never beats the weights' read at the assumed bandwidth.
    assert picked >= (1 - 1e-9) * k * sum(ns) * 2 / dc.HBM_BYTES_PER_S


def test_split_bounds_cover_k_once():
    for k_iters in (1, 4, 7, 64):
        for split_k in range(1, k_iters + 1):
            bounds = [dc.split_bounds(s, k_iters, split_k) for s in range(split_k)]
            assert bounds[0][0] == 0 and bounds[-1][1] == k_iters
            assert all(hi > lo for lo, hi in bounds)
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


@pytest.mark.parametrize(
    "m, k, n, config, reason",
    [
        (65, 128, 64, dc.DecodeConfig(), "M=65 must be in"),
        (8, 128, 96, dc.DecodeConfig(), "N=96 must be a multiple of 64"),
        (8, 128, 64, dc.DecodeConfig(split_k=3), "split_k=3 must be in"),
        (8, 128, 64, dc.DecodeConfig(tile_n=96), "tile_n=96"),
        (8, 128, 64, dc.DecodeConfig(stages=16, tile_n=256), "shared memory"),
        (8, 1024, 64, dc.DecodeConfig(tile_n=64, split_k=16, stages=3, reduction="cluster"),
         "portable cluster size"),
        (8, 256, 64, dc.DecodeConfig(tile_n=64, split_k=4, stages=3, reduction="cluster"),
         "interpreter runs clusters of at most 2"),
    ],
)
def test_unsupported_says_why(m, k, n, config, reason):
    x, w = jnp.zeros((m, k), BF16), jnp.zeros((k, n), BF16)
    with pytest.raises(Unsupported, match=reason):
        dm.lazy_rms_decode_matmul(x, [w], row_scale=jnp.ones((m,)), config=config,
                                  interpret=True)


def test_row_scale_shape_is_checked():
    x, w = jnp.zeros((4, 128), BF16), jnp.zeros((128, 64), BF16)
    with pytest.raises(ValueError, match="row_scale"):
        dm.lazy_rms_decode_matmul(x, [w], row_scale=jnp.ones((5,)), interpret=True)
