"""h = r + Norm(x @ W + b) with its RowStats (`return_statistics=True`): values, gradients,
the next pre-norm op fed by them, bad input; the kernel's per-tile partials under the
race-checked interpreter.

Judged against float64 through verify.residual: h as `check_op` judges it, its (mean, M2)
within what the float32 h's error does to them. Residual rows have |mean|/std up to 1e3,
where a sum of squares would have lost the variance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxnorm
from jaxnorm import row_stats
from kernel_checks import assert_race_free
from pallas_kernels import post_norm_matmul as pn
from verify import residual as vr
from verify.checks import post_norm_reference

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
OPS = ["dense_rms_norm", "dense_layer_norm"]


def _inputs(rng, lead, k, n, dtype=BF16, *, op="dense_rms_norm", mean_ratio=0.0,
            bias=True) -> dict:
    """x [*lead, K], kernel, gain (Gemma's 1 + g), and residual_after rows of |mean|/std
    ~ mean_ratio (either sign)."""
    residual = rng.standard_normal((*lead, n))
    if mean_ratio:
        sign = np.where(rng.random((*lead, 1)) < 0.5, -1.0, 1.0)
        residual = residual + mean_ratio * sign * (1.0 + rng.random((*lead, 1)))
    inputs = dict(
        x=rng.standard_normal((*lead, k)).astype(dtype),
        kernel=(rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype),
        bias=rng.standard_normal(n).astype(F32) if bias else None,
        scale=(0.2 * rng.standard_normal(n)).astype(F32),
        residual_after=residual.astype(dtype), eps=1e-6, scale_offset=1.0)
    if op == "dense_layer_norm":
        inputs["norm_bias"] = rng.standard_normal(n).astype(F32)
    return inputs


def _call(op: str, inputs: dict, impl: str | None, **kw):
    g = inputs.get
    vectors = [g("bias"), g("scale")] + ([g("norm_bias")] if op == "dense_layer_norm" else [])
    fn = jaxnorm.dense_rms_norm if op == "dense_rms_norm" else jaxnorm.dense_layer_norm
    return fn(g("x"), g("kernel"), *vectors, eps=g("eps"), scale_offset=g("scale_offset"),
              impl=impl, **{"residual_after": g("residual_after"), **kw})


# ------------------------------------------------------------------ xla and automatic


@pytest.mark.parametrize("impl", ["xla", None])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("lead, k, n, dtype, mean_ratio", [
    ((2, 7), 64, 128, BF16, 0.0), ((33,), 128, 96, F32, 1e3), ((16,), 64, 256, BF16, 1e3)],
    ids=["bf16-lead2", "f32-mean1e3", "bf16-mean1e3"])
def test_statistics_match_float64(rng, op, impl, lead, k, n, dtype, mean_ratio):
    inputs = _inputs(rng, lead, k, n, dtype, op=op, mean_ratio=mean_ratio)
    assert vr.check_post_norm_statistics(op, impl, **inputs) <= 1.0
    h, stats = _call(op, inputs, impl, return_statistics=True)
    assert stats.mean.shape == stats.m2.shape == lead and stats.length == n
    assert stats.mean.dtype == stats.m2.dtype == jnp.float32
    # The same h as without statistics, bit for bit.
    np.testing.assert_array_equal(np.asarray(h), np.asarray(_call(op, inputs, impl)))


@pytest.mark.parametrize("impl", ["xla", None])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype, mean_ratio", [(BF16, 1e3), (F32, 0.0)],
                         ids=["bf16-mean1e3", "f32"])
def test_gradient_through_h_and_its_statistics(rng, op, impl, dtype, mean_ratio):
    """Cotangents for h, mean and M2 at once: dH = dh + d_mean / N + 2 d_m2 (h - mean)."""
    inputs = _inputs(rng, (24,), 64, 128, dtype, op=op, mean_ratio=mean_ratio)
    assert vr.check_post_norm_statistics_grad(op, impl, **inputs) <= 1.0


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_next_pre_norm_takes_them_and_trains_as_unfused(rng, kind):
    """h -> rms_norm_dense(h, statistics=...): the consumer's output against float64, and
    the pair's gradient equal to that of the pair whose norm reduces h itself."""
    op = f"dense_{kind}_norm"
    inputs = _inputs(rng, (32,), 64, 128, F32, op=op, mean_ratio=30.0)
    w2 = jnp.asarray(rng.standard_normal((128, 64)) / np.sqrt(128), jnp.float32)
    g2 = jnp.asarray(1.0 + 0.2 * rng.standard_normal(128), jnp.float32)
    nb2 = jnp.asarray(0.2 * rng.standard_normal(128), jnp.float32)

    def consume(h, stats):
        if kind == "rms":
            return jaxnorm.rms_norm_dense(h, g2, w2, statistics=stats)
        return jaxnorm.layer_norm_dense(h, g2, nb2, w2, statistics=stats)

    h, stats = _call(op, inputs, "xla", return_statistics=True)
    consumer = dict(x=h, scale=g2, kernel=w2, eps=1e-6,
                    **({"norm_bias": nb2} if kind == "layer" else {}))
    out = consume(h, stats)
    assert vr.check_consumer(f"{kind}_norm_dense", out, None, source="float32",
                             **consumer) <= 1.0

    def loss(x, r, fused: bool):
        a = {**inputs, "x": x, "residual_after": r}
        if fused:
            return jnp.sum(jnp.sin(consume(*_call(op, a, "xla", return_statistics=True))))
        return jnp.sum(jnp.sin(consume(_call(op, a, "xla"), None)))

    x, r = jnp.asarray(inputs["x"]), jnp.asarray(inputs["residual_after"])
    fused = jax.grad(loss, argnums=(0, 1))(x, r, True)
    unfused = jax.grad(loss, argnums=(0, 1))(x, r, False)
    for a, b in zip(fused, unfused):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-4 * float(jnp.max(jnp.abs(b))))


def test_bad_requests_are_refused(rng):
    inputs = _inputs(rng, (8,), 64, 128)
    with pytest.raises(ValueError, match="return_statistics=True needs residual_after"):
        jaxnorm.dense_rms_norm(inputs["x"], inputs["kernel"], None, None,
                               residual=inputs["residual_after"], return_statistics=True)
    with pytest.raises(ValueError, match="return_statistics=True needs residual_after"):
        jaxnorm.dense_layer_norm(inputs["x"], inputs["kernel"], None, None, None,
                                 return_statistics=True)
    with pytest.raises(TypeError, match="return_statistics must be a bool"):
        _call("dense_rms_norm", inputs, None, return_statistics="yes")


def test_column_parallel_statistics_are_refused(rng):
    inputs = _inputs(rng, (8,), 64, 128, F32)
    mesh = jax.make_mesh((1,), ("model",), axis_types=(jax.sharding.AxisType.Auto,))
    P = jax.sharding.PartitionSpec

    def local(x, w, r):
        return jaxnorm.dense_rms_norm(x, w, None, None, residual_after=r,
                                      return_statistics=True, axis_name="model")

    with pytest.raises(ValueError, match="return_statistics=True and axis_name= together"):
        jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, "model"), P(None, "model")),
                      out_specs=P())(inputs["x"], inputs["kernel"], inputs["residual_after"])


# ------------------------------------------------------------------ the kernel


def _check_partials(kind, config, m, k, n, *, mean_ratio, in_registers=False, rng):
    """Run the kernel with output_stats; its partials, Chan-combined as the backend does,
    against the float64 statistics of the float64 h."""
    op = f"dense_{kind}_norm"
    inputs = _inputs(rng, (m,), k, n, op=op, mean_ratio=mean_ratio)
    inputs["scale"] = inputs["scale"] + 1.0  # the kernel takes the offset gain
    inputs["scale_offset"] = 0.0
    g = inputs.get
    y, h, (sums, m2s) = pn.post_norm_matmul(
        *(None if a is None else jnp.asarray(a) for a in (
            g("x"), g("kernel"), g("bias"), g("scale"), g("norm_bias"), g("residual_after"))),
        kind=kind, eps=1e-6, config=config, pre_norm_sum=False, residual_after=True,
        output_stats=True, interpret=True)
    assert_race_free()
    assert h is None and sums.shape == m2s.shape == (n // config.tile_n, m)
    mean, m2 = row_stats.from_partials(sums, m2s, config.tile_n)
    h64, t_h32, _, _ = post_norm_reference(kind, g("x"), g("kernel"), g("bias"), g("scale"),
                                           g("norm_bias"), None, 1e-6, 0.0,
                                           g("residual_after"), y_dtype=np.float32,
                                           dot_dtype=np.float32)
    mean64, m2_64 = vr.row_statistics(h64)
    t_mean, t_m2 = vr.statistics_tolerance(h64, t_h32)
    assert np.all(np.abs(np.asarray(mean) - mean64) <= t_mean)
    assert np.all(np.abs(np.asarray(m2) - m2_64) <= t_m2)
    # y is the residual-after output the kernel writes without statistics.
    y0, _ = pn.post_norm_matmul(
        *(None if a is None else jnp.asarray(a) for a in (
            g("x"), g("kernel"), g("bias"), g("scale"), g("norm_bias"), g("residual_after"))),
        kind=kind, eps=1e-6, config=config, pre_norm_sum=False, residual_after=True,
        interpret=True)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y0))


@pytest.mark.parametrize(
    "kind, tile_n, cluster_n, split_rows, in_registers, chained",
    [("rms", 64, 2, False, False, False), ("layer", 64, 4, False, True, True),
     ("rms", 256, 2, True, False, False), ("layer", 256, 2, True, True, False)],
    ids=["rms-2-ctas-staged", "layer-4-ctas-registers-chained", "rms-256-wide-split",
         "layer-256-wide-registers-split"])
def test_kernel_partials_over_several_ctas_and_blocks(rng, kind, tile_n, cluster_n,
                                                      split_rows, in_registers, chained):
    """Rows spanning 2-4 CTAs (4-8 partials a row), three row blocks per cluster, residual
    rows of |mean|/std ~ 1e3; warpgroups side by side or stacked (split_rows)."""
    config = pn.PostNormConfig(tile_m=64, tile_n=tile_n, cluster_n=cluster_n, tile_k=32,
                               max_concurrent_steps=2, transport="global", grid_clusters=1,
                               chain_blocks=chained, residual_in_registers=in_registers,
                               split_rows=split_rows)
    _check_partials(kind, config, 3 * config.cta_m, 128, config.cta_n * cluster_n,
                    mean_ratio=1e3, rng=rng)


@pytest.mark.parametrize("op", OPS)
def test_kernel_through_the_op_with_padded_rows(rng, op):
    """The public op on the kernel: M = 100 (not a multiple of the 64-row tile, above
    decode's 64), rows over two CTAs, |mean|/std ~ 1e3; and its gradient (kernel forward)."""
    inputs = _inputs(rng, (100,), 128, 512, op=op, mean_ratio=1e3)
    assert vr.check_post_norm_statistics(op, "interpret", **inputs) <= 1.0
    assert_race_free()
    h_xla, _ = _call(op, inputs, "xla", return_statistics=True)
    h, _ = _call(op, inputs, "interpret", return_statistics=True)
    assert h.shape == h_xla.shape
    assert vr.check_post_norm_statistics_grad(op, "interpret", **inputs) <= 1.0
    assert_race_free()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("m", [1, 7, 64])
def test_decode_rows_take_the_decode_gemm_then_the_xla_norm(rng, op, m):
    """At M <= 64 the op's product is the decode GEMM's (interpreter, race detection) and
    XLA norms it: against float64, |mean|/std ~ 1e3, with the statistics; and the norm
    after the product is the xla path's, so with the xla path's own product it agrees
    with the xla path to bf16 rounding of the product."""
    inputs = _inputs(rng, (m,), 192, 256, op=op, mean_ratio=1e3)
    assert vr.check_post_norm_statistics(op, "interpret", **inputs) <= 1.0
    assert_race_free()
    y, stats = _call(op, inputs, "interpret", return_statistics=True)
    y_xla, stats_xla = _call(op, inputs, "xla", return_statistics=True)
    assert y.shape == y_xla.shape == (m, 256) and stats.mean.shape == (m,)
    np.testing.assert_allclose(np.asarray(y, F32), np.asarray(y_xla, F32),
                               rtol=2**-6, atol=2**-6 * float(np.abs(np.asarray(y_xla, F32)).max()))


def test_decode_rows_follow_the_decode_gemm_table(monkeypatch):
    """impl=None at M <= 64 asks the decode GEMM's measured table (the post-norm kernel's
    residual-after rule is for prefill): kernel at a launch measured <= DECODE_MAX_RATIO of
    cuBLAS, the reason at one measured slower or not measured at all."""
    from jaxnorm.backends import mosaic_norms
    from pallas_kernels import decode_configs, hardware
    fields = dict(tile_n=64, tile_k=64, split_k=1, stages=12, warpgroups=1)
    monkeypatch.setattr(decode_configs, "ENTRIES", (
        ((1, 6912, (1152,)), fields, 0.61), ((8, 6912, (1152,)), fields, 1.2)))
    monkeypatch.setattr(decode_configs, "PROVENANCE", {"sms": hardware.num_sms()})
    w, bf = jnp.ones((6912, 1152), jnp.bfloat16), jnp.bfloat16
    decline = mosaic_norms._post_norm_not_faster
    assert decline("rms", jnp.ones((1, 6912), bf), w, jnp.ones((1, 1152), bf), True) is None
    assert decline("layer", jnp.ones((1, 6912), bf), w, None) is None
    assert "1.200x cuBLAS" in decline("rms", jnp.ones((8, 6912), bf), w, None, True)
    assert "no measured shape" in decline("rms", jnp.ones((1, 512), bf), jnp.ones((512, 64), bf),
                                          None, True)
    # Above decode's rows the post-norm kernel's own rule still holds.
    assert "measured slower" in decline("rms", jnp.ones((128, 6912), bf), w, None, True)


# ------------------------------------------------------------------ the models


@pytest.mark.parametrize("preset, tied", [("gemma2", True), ("gemma3", False), ("olmo2", False)])
def test_models_hand_post_norm_statistics_to_the_next_input_norm(monkeypatch, preset, tied):
    """Fused Gemma 2/3: every post-sublayer norm op returns its sum's statistics, and every
    later layer's input norm (and an untied head's) takes the previous layer's, equal to
    those of the stream it reads; OLMo 2 (no input norms) asks for none. Logits match the
    stock network's."""
    from flax import nnx

    from jaxnorm import models
    from jaxnorm import ops

    cfg = getattr(models, preset)(n_layers=2, tied_embeddings=tied)
    asked, given = [], []
    real_post, real_pre = jaxnorm.dense_rms_norm, ops.rms_norm_dense

    def post(*a, **k):
        asked.append(k.get("return_statistics", False))
        return real_post(*a, **k)

    def pre(x, *a, statistics=None, **k):
        if statistics is not None:
            ref = row_stats.of_rows(x)
            np.testing.assert_allclose(statistics.mean, ref.mean, rtol=1e-5,
                                       atol=1e-5 * float(jnp.max(jnp.abs(x))))
            np.testing.assert_allclose(statistics.m2, ref.m2, rtol=1e-4)
        given.append(statistics is not None)
        return real_pre(x, *a, statistics=statistics, **k)

    monkeypatch.setattr(jaxnorm, "dense_rms_norm", post)
    monkeypatch.setattr(ops, "rms_norm_dense", pre)
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, cfg.vocab_size)
    fused, _ = models.Transformer(cfg.replace(fused=True), rngs=nnx.Rngs(0))(tokens)
    if cfg.pre_norms:
        assert asked == [True] * (2 * cfg.n_layers)
        # layer 0's attention input norm reads the embedding; the head is untied or a norm
        assert given == [False] + [True] * (cfg.n_layers - 1) + ([] if tied else [True])
    else:
        assert not any(asked) and len(asked) == 4 * cfg.n_layers  # o, down, q and k norms
    monkeypatch.undo()
    stock, _ = models.Transformer(cfg.replace(fused=False), rngs=nnx.Rngs(0))(tokens)
    np.testing.assert_allclose(fused, stock, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(stock))))


def test_identity_statistics_of_the_post_norm_sum_from_tile_partials(rng):
    """verify's identity: h = r + RMSNorm(x W; g) has the statistics Chan's combine of its
    per-tile (sum, M2) gives, rows of |mean| ~ 1e3 included."""
    from verify import identities

    x, w = rng.standard_normal((4, 16)), rng.standard_normal((16, 64))
    r = rng.standard_normal((4, 64)) + rng.uniform(-1e3, 1e3, (4, 1))
    g = rng.standard_normal(64)
    assert identities.residual_after_statistics(x, w, r, g, 1e-6, 8) < 1e-12
    # Tiles of unequal width (64 columns in 7 tiles) combine as well.
    assert identities.residual_after_statistics(x, w, r, g, 1e-6, 7) < 1e-12
