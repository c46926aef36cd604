"""residual_dense and the pre-norm ops given its statistics: values, gradients, bad input.

Judged through verify.residual against float64 (xla and automatic paths here; the
kernel under the interpreter in test_residual_kernel.py).
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from graph_checks import primitive_counts
from verify import residual as vr
from verify.references import f64

BF16 = jnp.bfloat16


def _rng(request) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def residual_inputs(rng, lead, k, n, dtype=BF16, *, bias=True, mean_ratio=0.0):
    """x [*lead, K], kernel [K, N], residual [*lead, N] (rows of |mean|/std ~ mean_ratio)."""
    residual = rng.standard_normal((*lead, n))
    if mean_ratio:
        sign = np.where(rng.random((*lead, 1)) < 0.5, -1.0, 1.0)
        residual = residual + mean_ratio * sign * (1.0 + rng.random((*lead, 1)))
    return dict(
        x=jnp.asarray(rng.standard_normal((*lead, k)), dtype),
        kernel=jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), dtype),
        residual=jnp.asarray(residual, dtype),
        bias=jnp.asarray(rng.standard_normal(n), jnp.float32) if bias else None,
    )


def consumer_inputs(rng, kind, k, ns, dtype=BF16):
    kernels = [jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), dtype) for n in ns]
    inputs = dict(kernel=kernels if len(ns) > 1 else kernels[0], eps=1e-6,
                  scale=jnp.asarray(1.0 + 0.2 * rng.standard_normal(k), jnp.float32),
                  bias=None)
    if kind == "layer":
        inputs["norm_bias"] = jnp.asarray(0.2 * rng.standard_normal(k), jnp.float32)
    return inputs


def consume(kind, h, stats, inputs, impl):
    args = dict(eps=inputs["eps"], impl=impl, statistics=stats)
    if kind == "rms":
        return jaxnorm.rms_norm_dense(h, inputs["scale"], inputs["kernel"], inputs["bias"],
                                      **args)
    return jaxnorm.layer_norm_dense(h, inputs["scale"], inputs["norm_bias"], inputs["kernel"],
                                    inputs["bias"], **args)


# ------------------------------------------------------------------ values


@pytest.mark.parametrize("impl", ["xla", None])
@pytest.mark.parametrize("case", [
    ((64,), 128, 96, BF16, True, 0.0),
    ((2, 5), 64, 256, BF16, False, 0.0),
    ((33,), 64, 128, jnp.float32, True, 0.0),
    ((16,), 128, 128, BF16, True, 30.0),
    ((9,), 64, 64, jnp.float16, True, 0.0),
], ids=["bf16", "lead2_nobias", "f32", "bf16_mean30", "f16"])
def test_residual_dense_matches_float64(case, impl, request):
    lead, k, n, dtype, bias, mean_ratio = case
    inputs = residual_inputs(_rng(request), lead, k, n, dtype, bias=bias, mean_ratio=mean_ratio)
    assert vr.check_residual(impl, **inputs) <= 1.0
    h, stats = jaxnorm.residual_dense(inputs["x"], inputs["kernel"], inputs["residual"],
                                      inputs["bias"], impl=impl)
    assert h.dtype == dtype and h.shape == (*lead, n)
    assert stats.mean.shape == lead and stats.m2.dtype == jnp.float32 and stats.length == n


def test_xla_path_is_the_users_bf16_expression(request):
    """h is what XLA users write: x @ w + r in x's dtype (bias added in that dtype)."""
    inputs = residual_inputs(_rng(request), (32,), 64, 128)
    x, w, r, b = inputs["x"], inputs["kernel"], inputs["residual"], inputs["bias"]
    h, _ = jaxnorm.residual_dense(x, w, r, b, impl="xla")
    np.testing.assert_array_equal(np.asarray(h), np.asarray(x @ w + b.astype(BF16) + r))


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("ns", [(128,), (64, 192)], ids=["one", "two_kernels"])
def test_consumer_with_statistics_matches_float64(kind, ns, request):
    rng = _rng(request)
    inputs = residual_inputs(rng, (3, 24), 64, 128, mean_ratio=3.0 if kind == "layer" else 0.0)
    h, stats = jaxnorm.residual_dense(inputs["x"], inputs["kernel"], inputs["residual"],
                                      inputs["bias"], impl="xla")
    norm_inputs = consumer_inputs(rng, kind, 128, ns)
    out = consume(kind, h, stats, norm_inputs, "xla")
    op = f"{kind}_norm_dense"
    assert vr.check_consumer(op, out, "xla", x=h, **norm_inputs) <= 1.0


def test_statistics_replace_the_reduction_over_x(request):
    """Given x's own statistics the op equals the op that reduces x (same rounding here)."""
    rng = _rng(request)
    x = jnp.asarray(rng.standard_normal((40, 128)), jnp.float32)
    inputs = consumer_inputs(rng, "rms", 128, (64,), jnp.float32)
    stats = jaxnorm.RowStats(jnp.mean(x, -1), jnp.sum((x - jnp.mean(x, -1)[:, None])**2, -1),
                             128)
    given = consume("rms", x, stats, inputs, "xla")
    plain = jaxnorm.rms_norm_dense(x, inputs["scale"], inputs["kernel"], impl="xla")
    np.testing.assert_allclose(np.asarray(given), np.asarray(plain), rtol=1e-5, atol=1e-5)


def test_row_stats_is_a_pytree_with_static_length():
    stats = jaxnorm.RowStats(jnp.ones(3), jnp.zeros(3), 7)
    assert len(jax.tree.leaves(stats)) == 2
    out = jax.jit(lambda s: jax.tree.map(lambda a: a * 2, s))(stats)
    assert isinstance(out, jaxnorm.RowStats) and out.length == 7


# ------------------------------------------------------------------ gradients


def _cotangents(rng, h, stats):
    return (jnp.asarray(rng.standard_normal(h.shape), h.dtype),
            jnp.asarray(rng.standard_normal(stats.mean.shape), jnp.float32),
            jnp.asarray(rng.standard_normal(stats.m2.shape) / h.shape[-1], jnp.float32))


@pytest.mark.parametrize("impl", ["xla", None])
@pytest.mark.parametrize("dtype", [BF16, jnp.float32])
def test_residual_dense_gradient_matches_float64(impl, dtype, request):
    rng = _rng(request)
    inputs = residual_inputs(rng, (2, 16), 64, 128, dtype)
    names = ("x", "kernel", "residual", "bias")

    def f(a):
        h, stats = jaxnorm.residual_dense(a["x"], a["kernel"], a["residual"], a["bias"],
                                          impl=impl)
        return h, stats.mean, stats.m2

    primal = {k: inputs[k] for k in names}
    out, vjp = jax.vjp(f, primal)
    dh, dmean, dm2 = _cotangents(rng, out[0], jaxnorm.RowStats(out[1], out[2], 128))
    (grads,) = vjp((dh, dmean, dm2))
    args = [inputs[k] for k in names]
    expected = vr.residual_vjp(*args, dh, dmean, dm2)
    magnitudes = vr.residual_vjp(*args, dh, dmean, dm2, magnitude=True)
    assert vr.check_grads(grads, expected, magnitudes, dtype, 128) <= 1.0


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("impl", ["xla", None])
def test_composed_gradient_equals_the_unfused_pair(kind, impl, request):
    """residual_dense -> Norm(statistics=...) @ W2: the gradient of h -> Norm -> dense."""
    rng = _rng(request)
    inputs = residual_inputs(rng, (32,), 64, 128, jnp.float32)
    norm_inputs = consumer_inputs(rng, kind, 128, (96,), jnp.float32)
    norm_inputs["bias"] = jnp.asarray(rng.standard_normal(96), jnp.float32)
    dy = jnp.asarray(rng.standard_normal((32, 96)), jnp.float32)
    res_names = ("x", "kernel", "residual", "bias")
    norm_names = ("scale", "kernel", "bias") + (("norm_bias",) if kind == "layer" else ())

    def loss(a, b):
        h, stats = jaxnorm.residual_dense(*(a[k] for k in res_names), impl=impl)
        y = consume(kind, h, stats, {**norm_inputs, **b}, impl)
        return jnp.sum(y * dy)

    grads_a, grads_b = jax.grad(loss, argnums=(0, 1))(
        {k: inputs[k] for k in res_names}, {k: norm_inputs[k] for k in norm_names})
    got = {**grads_a, **{f"norm_{k}": v for k, v in grads_b.items()}}
    expected = vr.composed_vjp(kind, inputs, norm_inputs, f64(dy), magnitude=False)
    magnitudes = vr.composed_vjp(kind, inputs, norm_inputs, f64(dy), magnitude=True)
    assert vr.check_grads(got, expected, magnitudes, jnp.float32, 128) <= 1.0


# ------------------------------------------------------------------ bad input


def test_residual_dense_rejects_bad_input():
    x, w = jnp.ones((4, 8), BF16), jnp.ones((8, 16), BF16)
    with pytest.raises(ValueError, match=r"residual must have shape \(4, 16\)"):
        jaxnorm.residual_dense(x, w, jnp.ones((4, 8), BF16))
    with pytest.raises(ValueError, match="residual dtype float32 differs from x dtype"):
        jaxnorm.residual_dense(x, w, jnp.ones((4, 16), jnp.float32))
    with pytest.raises(ValueError, match="kernel has K=7"):
        jaxnorm.residual_dense(x, jnp.ones((7, 16), BF16), jnp.ones((4, 16), BF16))
    with pytest.raises(ValueError, match=r"bias must have shape \(16,\)"):
        jaxnorm.residual_dense(x, w, jnp.ones((4, 16), BF16), jnp.ones(8))
    with pytest.raises(ValueError, match="residual must be a floating-point array"):
        jaxnorm.residual_dense(x, w, jnp.ones((4, 16), jnp.int32))
    with pytest.raises(ValueError, match="impl must be"):
        jaxnorm.residual_dense(x, w, jnp.ones((4, 16), BF16), impl="cuda")


@pytest.mark.parametrize("op", ["rms", "layer"])
def test_statistics_that_do_not_match_x_are_refused(op):
    x, w = jnp.ones((2, 3, 8)), jnp.ones((8, 4))

    def call(stats, **kw):
        if op == "rms":
            return jaxnorm.rms_norm_dense(x, None, w, statistics=stats, **kw)
        return jaxnorm.layer_norm_dense(x, None, None, w, statistics=stats, **kw)

    good = jaxnorm.RowStats(jnp.zeros((2, 3)), jnp.ones((2, 3)), 8)
    with pytest.raises(ValueError, match=r"statistics.mean has shape \(6,\) but x has shape "
                                         r"\(2, 3, 8\)"):
        call(good._replace(mean=jnp.zeros(6)))
    with pytest.raises(ValueError, match=r"statistics.m2 has shape \(2, 4\)"):
        call(good._replace(m2=jnp.zeros((2, 4))))
    with pytest.raises(ValueError, match=r"statistics.length is 16 but x has shape \(2, 3, 8\)"):
        call(good._replace(length=16))
    with pytest.raises(TypeError, match="statistics must be jaxnorm.RowStats"):
        call((good.mean, good.m2))
    assert call(good).shape == (2, 3, 4)


# ------------------------------------------------------------------ falling back


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_automatic_fallback_runs_stocks_graph(request, kind):
    """Under impl=None falling back to xla (CPU here), residual_dense -> norm(statistics=)
    is stock's graph: the norm reduces h itself and the producer's statistics are dead
    code, forward and backward; impl="xla" keeps the given-statistics formulation."""
    rng = _rng(request)
    inputs = residual_inputs(rng, (8,), 64, 128)
    consumer = consumer_inputs(rng, kind, 128, (64,))
    args = (inputs["x"], inputs["kernel"], inputs["residual"])

    def fused(x, w, r, impl):
        h, stats = jaxnorm.residual_dense(x, w, r, impl=impl)
        return consume(kind, h, stats, consumer, impl).astype(jnp.float32).sum()

    def stock(x, w, r):
        return consume(kind, r + x @ w, None, consumer, None).astype(jnp.float32).sum()

    for fn, reference in ((fused, stock), (jax.grad(fused, (0, 1, 2)), jax.grad(stock, (0, 1, 2)))):
        auto = primitive_counts(lambda *a, fn=fn: fn(*a, None), *args)
        assert auto == primitive_counts(reference, *args)
        assert primitive_counts(lambda *a, fn=fn: fn(*a, "xla"), *args) != auto
    np.testing.assert_allclose(np.float32(fused(*args, None)), np.float32(fused(*args, "xla")),
                               rtol=2e-2)


@pytest.mark.parametrize("producer", ["residual_dense", "dense_rms_norm"])
def test_rms_reader_keeps_one_reduction_of_the_xla_statistics(request, producer):
    """The xla path's statistics carry mean(h^2): an RMSNorm reader given them (its
    given-statistics formulation here) keeps as many reductions as the same reader
    reducing h itself, the dead two-pass (mean, M2) dropped; its output matches the
    reader's from (mean, M2) alone to float32 rounding."""
    rng = _rng(request)
    inputs = residual_inputs(rng, (8,), 64, 128)
    consumer = consumer_inputs(rng, "rms", 128, (64,))
    args = (inputs["x"], inputs["kernel"], inputs["residual"])

    def produce(x, w, r):
        if producer == "residual_dense":
            return jaxnorm.residual_dense(x, w, r)
        return jaxnorm.dense_rms_norm(x, w, None, None, residual_after=r,
                                      return_statistics=True)

    def given(x, w, r):
        h, stats = produce(x, w, r)
        assert stats.mean_square is not None
        return consume("rms", h, stats, consumer, "xla")

    def reducing_h(x, w, r):
        return consume("rms", produce(x, w, r)[0], None, consumer, "xla")

    def from_mean_and_m2(x, w, r):
        h, stats = produce(x, w, r)
        return consume("rms", h, stats._replace(mean_square=None), consumer, "xla")

    counts = {fn.__name__: primitive_counts(fn, *args)["reduce_sum"]
              for fn in (given, reducing_h, from_mean_and_m2)}
    assert counts["given"] == counts["reducing_h"] < counts["from_mean_and_m2"], counts
    h, stats = produce(*args)
    h64 = np.asarray(h, np.float64)
    np.testing.assert_allclose(stats.mean_square, np.mean(h64 * h64, axis=-1), rtol=1e-5)
    # bf16 outputs of row scales equal to float32 rounding: at most one ulp apart.
    np.testing.assert_allclose(np.float32(given(*args)), np.float32(from_mean_and_m2(*args)),
                               rtol=2.0**-8, atol=1e-6)


@pytest.fixture
def kernel_where_automatic_picks_it(monkeypatch):
    """impl=None resolves as on a Hopper GPU, and the kernel it picks runs interpreted."""
    from jaxnorm import dispatch

    monkeypatch.setattr(dispatch, "hopper_or_newer", lambda: True)
    resolve = dispatch.resolve

    def interpreted(op, impl, *args, **kwargs):
        chosen = resolve(op, impl, *args, **kwargs)
        return "interpret" if chosen == "mosaic" else chosen

    monkeypatch.setattr(dispatch, "resolve", interpreted)


def test_automatic_kernel_differentiates_stocks_graph(kernel_where_automatic_picks_it, request):
    """Where impl=None picks the pre-norm kernel for given statistics (M = 1024, Hopper
    simulated), the gradient is that of h -> norm -> dense through h alone: the statistics'
    cotangent is exactly zero, and the composed gradient matches float64."""
    rng = _rng(request)
    inputs = residual_inputs(rng, (1024,), 64, 128, bias=False)
    norm_inputs = consumer_inputs(rng, "rms", 128, (256,))
    dy = jnp.asarray(rng.standard_normal((1024, 256)), BF16)
    res_names, norm_names = ("x", "kernel", "residual"), ("scale", "kernel")

    def loss(a, b):
        h, stats = jaxnorm.residual_dense(*(a[k] for k in res_names))
        y = consume("rms", h, stats, {**norm_inputs, **b}, None)
        return jnp.sum(y.astype(jnp.float32) * dy.astype(jnp.float32))

    h, stats = jaxnorm.residual_dense(*(inputs[k] for k in res_names))
    d_stats = jax.grad(lambda s: consume("rms", h, s, norm_inputs, None).astype(
        jnp.float32).sum())(stats)
    assert not np.any(np.asarray(d_stats.mean)) and not np.any(np.asarray(d_stats.m2))
    grads_a, grads_b = jax.grad(loss, argnums=(0, 1))(
        {k: inputs[k] for k in res_names}, {k: norm_inputs[k] for k in norm_names})
    got = {**grads_a, **{f"norm_{k}": v for k, v in grads_b.items()}}
    args = ({**inputs, "bias": None}, {**norm_inputs, "bias": None}, f64(dy))
    expected = vr.composed_vjp("rms", *args, magnitude=False)
    magnitudes = vr.composed_vjp("rms", *args, magnitude=True)
    assert vr.check_grads(got, expected, magnitudes, BF16, 128) <= 1.0


def test_automatic_kernel_serves_inference_only(kernel_where_automatic_picks_it, request):
    """impl=None's kernel for given statistics runs where nothing differentiates the op; a
    training step's gradient traces stock's graph alone (no kernel forward whose normalized
    input the backward would form again), and its primal output is stock's value."""
    rng = _rng(request)
    inputs = residual_inputs(rng, (1024,), 64, 128, bias=False)
    norm_inputs = consumer_inputs(rng, "rms", 128, (256,))
    h, stats = jaxnorm.residual_dense(inputs["x"], inputs["kernel"], inputs["residual"])

    def loss(h):
        y = consume("rms", h, stats, norm_inputs, None)
        return jnp.sum(jnp.square(y.astype(jnp.float32)))

    # An interpreted Mosaic GPU kernel traces as one `mpmd_map` (pallas_call on the GPU).
    assert primitive_counts(lambda h: consume("rms", h, stats, norm_inputs, None), h)[
        "mpmd_map"] == 1
    assert primitive_counts(jax.value_and_grad(loss), h)["mpmd_map"] == 0
    value = jax.value_and_grad(loss)(h)[0]
    stock = jnp.sum(jnp.square(
        consume("rms", h, None, norm_inputs, "xla").astype(jnp.float32)))
    np.testing.assert_allclose(value, stock, rtol=1e-6)
