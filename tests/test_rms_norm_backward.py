"""RMSNorm's backward kernel: under the Pallas GPU interpreter with race detection against
float64, lowered for "cuda" at the presets' training shapes, and where autodiff uses it.

The kernel (pallas_kernels/rms_norm_backward.py) maps x and the cotangent of RMSNorm(x)
to (dx, d scale) reading each once. Explicit impl="mosaic"/"interpret" norms use it in
their backward; under impl=None a training step's norms use it only where
jaxnorm/backends/norm_backward_measured.py has it measured faster.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxnorm
from jaxnorm import dispatch
from jaxnorm.backends import norm_backward_measured
from pallas_kernels import hardware
from pallas_kernels import rms_norm_backward as rb
from pallas_kernels.row_norm_config import make_config
from verify.checks import check_rms_norm_backward
from kernel_checks import assert_race_free

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
OP = "rms_norm_backward"


def _judge(x, g, scale, offset, eps, dx, d_scale) -> float:
    """verify's judge of (dx, d scale) against the float64 VJP of rms_norm (normwise)."""
    assert (d_scale is None) == (scale is None)
    return check_rms_norm_backward(dx, d_scale, x=x, g=g, scale=scale, eps=eps,
                                   scale_offset=offset)


# (M, K, dtype, gain dtype or None, gain offset): rows per CTA and vector widths the
# selection takes: 8-byte vectors (bf16), Gemma's K = 1152 with its (1 + g) gain stored in
# bf16 as the presets store it, f32 16-byte vectors, one row per CTA, M padded to blocks of
# 4 rows (6 rows of 320), QK-norm heads (K = 128).
CASES = [
    (16, 512, BF16, F32, 0.0),
    (12, 1152, BF16, BF16, 1.0),
    (8, 2048, F32, F32, 0.5),
    (6, 320, BF16, None, 1.0),  # no gain: the offset does not apply
    (64, 128, BF16, F32, 0.0),
    (5, 1024, F16, F32, 0.0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}-gain-{c[3]}")
def test_kernel_matches_float64(rng, case):
    m, k, dtype, gain_dtype, offset = case
    x = rng.standard_normal((m, k)).astype(dtype)
    g = rng.standard_normal((m, k)).astype(dtype)
    scale = None if gain_dtype is None else rng.standard_normal(k).astype(gain_dtype)
    dx, d_scale = dispatch.call(OP, "interpret", jnp.asarray(x), jnp.asarray(g),
                                None if scale is None else jnp.asarray(scale), eps=1e-6,
                                scale_offset=offset)
    assert dx.dtype == dtype and dx.shape == (m, k)
    assert d_scale is None if scale is None else d_scale.dtype == gain_dtype
    assert _judge(x, g, scale, offset, 1e-6, dx, d_scale) <= 1.0
    assert_race_free()


def test_rows_stay_apart(rng):
    """A NaN in one row of x makes only that row's dx NaN; a zero row (eps > 0) gets
    r = 1/sqrt(eps), as the float64 VJP has it, and its gradient is finite."""
    m, k = 8, 512
    x = rng.standard_normal((m, k)).astype(BF16)
    x[2] = 0.0
    g = rng.standard_normal((m, k)).astype(BF16)
    scale = rng.standard_normal(k).astype(F32)
    dx, _ = dispatch.call(OP, "interpret", jnp.asarray(x), jnp.asarray(g), jnp.asarray(scale),
                          eps=1e-5, scale_offset=0.0)
    assert _judge(x, g, scale, 0.0, 1e-5, dx, _) <= 1.0
    x[5, 7] = np.nan
    dx, _ = dispatch.call(OP, "interpret", jnp.asarray(x), jnp.asarray(g), jnp.asarray(scale),
                          eps=1e-5, scale_offset=0.0)
    dx = np.asarray(dx, np.float32)
    assert np.isnan(dx[5]).all()
    assert np.isfinite(np.delete(dx, 5, axis=0)).all()


def test_explicit_impl_backward_runs_the_kernel(rng, monkeypatch):
    """jax.grad of rms_norm(impl="interpret") takes dx and d scale from the kernel, and they
    match float64."""
    calls = []
    original = rb.rms_norm_backward
    monkeypatch.setattr(rb, "rms_norm_backward",
                        lambda *a, **kw: calls.append(kw["config"]) or original(*a, **kw))
    m, k = 16, 256
    x = rng.standard_normal((m, k)).astype(BF16)
    scale = rng.standard_normal(k).astype(F32)
    g = rng.standard_normal((m, k)).astype(BF16)

    def loss(x, scale):
        y = jaxnorm.rms_norm(x, scale, eps=1e-6, scale_offset=1.0, impl="interpret")
        return jnp.sum(y.astype(jnp.float32) * jnp.asarray(g, jnp.float32))

    dx, d_scale = jax.grad(loss, argnums=(0, 1))(jnp.asarray(x), jnp.asarray(scale))
    assert len(calls) == 1
    assert _judge(x, g, scale, 1.0, 1e-6, dx, d_scale) <= 1.0


def test_automatic_dispatch_declines_the_unmeasured_kernel_and_keeps_stock_graph(monkeypatch):
    """Without a GPU measurement a training step planned for the H200 keeps JAX's autodiff of
    the stock norm and records nothing; `dispatch.decide` says why. Where the forward falls
    back too (QK-norm heads), the op stays plain JAX, forward-mode autodiff included."""
    monkeypatch.setattr(norm_backward_measured, "ENTRIES", ())
    S = jax.ShapeDtypeStruct
    x, scale = S((4096, 2048), jnp.bfloat16), S((2048,), jnp.float32)

    def loss(x, scale):
        return jnp.sum(jaxnorm.rms_norm(x, scale).astype(jnp.float32))

    with dispatch.recorded_choices() as made:
        text = _grad_lowered_for_h200(loss, x, scale)
        with jax.sharding.use_abstract_mesh(hardware.h200_mesh()):
            heads, gain = S((65536, 128), jnp.bfloat16), S((128,), jnp.float32)
            jax.jit(lambda x, s, t: jax.jvp(loss, (x, s), (t, s))).trace(heads, gain, heads).lower(
                lowering_platforms=("cuda",))
            impl, reason = dispatch.decide(OP, x, x, scale, eps=1e-6, scale_offset=0.0)
    assert OP not in made
    assert "custom_call @mosaic_gpu_v2(" not in text
    assert impl == "xla" and "no measured shape within 2x of 4096x2048" in reason


def _grad_lowered_for_h200(fn, *avals) -> str:
    with jax.sharding.use_abstract_mesh(hardware.h200_mesh()):
        lowered = jax.jit(jax.grad(fn, argnums=tuple(range(len(avals))))).trace(*avals).lower(
            lowering_platforms=("cuda",))
    return lowered.as_text()


@pytest.mark.parametrize("op", ["rms_norm", "rms_norm_dense", "given statistics",
                                "post-norm"])
def test_automatic_training_step_takes_a_measured_kernel(monkeypatch, op):
    """Where the table has the kernel faster, the backward of an impl=None op planned for
    the H200 has one more Mosaic launch (the norm's backward) than with the table empty,
    and an explicit impl="xla" none."""
    m, k, n = 4096, 2048, 512
    S = jax.ShapeDtypeStruct
    x, scale, w = S((m, k), jnp.bfloat16), S((k,), jnp.float32), S((k, n), jnp.bfloat16)

    def loss(impl, x, scale, w):
        if op == "rms_norm":
            y = jaxnorm.rms_norm(x, scale, impl=impl)
        elif op == "rms_norm_dense":
            y = jaxnorm.rms_norm_dense(x, scale, w, impl=impl)
        elif op == "given statistics":
            stats = jaxnorm.row_stats.of_rows(x)
            y = jaxnorm.rms_norm_dense(x, scale, w, impl=impl, statistics=stats)
        else:  # Gemma's o-projection: r + RMSNorm(x @ W), the norm over N
            y = jaxnorm.dense_rms_norm(x, w, None, scale[:n], residual_after=x[:, :n],
                                       impl=impl)
        return jnp.sum(y.astype(jnp.float32))

    def launches(impl) -> int:
        return _grad_lowered_for_h200(functools.partial(loss, impl), x, scale, w).count(
            "custom_call @mosaic_gpu_v2(")

    monkeypatch.setattr(norm_backward_measured, "PROVENANCE", {"sms": hardware.H200_SMS})
    monkeypatch.setattr(norm_backward_measured, "ENTRIES", ())
    before = launches(None)
    monkeypatch.setattr(norm_backward_measured, "ENTRIES", (
        ((m, k), "bfloat16", True, False, 1, 0.8, 10.0),
        ((m, n), "bfloat16", True, False, 1, 0.8, 10.0)))
    with dispatch.recorded_choices() as made:
        assert launches(None) == before + 1
    assert made[OP] == [("mosaic", None)]  # recorded by the backward that runs it
    assert launches("xla") == 0


# The model presets' training norms (M = batch x sequence rows of d_model) and their
# QK-norm heads (M x heads rows of head_dim), as the H200 would run them.
TRAINING_SHAPES = [(4096, 2048), (4096, 1024), (2048, 1152), (4096, 2560), (4096, 4096),
                   (65536, 128), (8192, 256)]


@pytest.mark.parametrize("m, k", TRAINING_SHAPES)
@pytest.mark.parametrize("with_gain", [True, False], ids=["gain", "folded"])
def test_kernel_lowers_for_cuda(m, k, with_gain):
    S = jax.ShapeDtypeStruct
    config = rb.select_backward_config(m, k, jnp.bfloat16, num_sms=hardware.H200_SMS)
    fn = functools.partial(rb.rms_norm_backward, eps=1e-6, scale_offset=0.0, config=config)
    scale = S((k,), jnp.float32) if with_gain else None
    with jax.sharding.use_abstract_mesh(hardware.h200_mesh()):
        lowered = jax.jit(fn).trace(S((m, k), jnp.bfloat16), S((m, k), jnp.bfloat16),
                                    scale).lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("custom_call @mosaic_gpu_v2(") == 1


@pytest.mark.parametrize("block_m, steps, with_gain", [(4, 4, True), (2, 3, True), (4, 2, False),
                                                        (1, 2, True)])
def test_several_row_blocks_per_cta(rng, block_m, steps, with_gain):
    """A CTA taking row blocks in turn (the next copy in flight, the gain's column sum running
    in shared memory) is race-free and matches float64; the H200's selection uses it where
    one block per CTA would take more than one wave."""
    m, k = block_m * steps * 3, 512
    rows = make_config(m, k, jnp.bfloat16, block_m=block_m, cluster_k=1, vector_bytes=8)
    config = rb.BackwardConfig(rows, steps)
    x = rng.standard_normal((m, k)).astype(BF16)
    g = rng.standard_normal((m, k)).astype(BF16)
    scale = rng.standard_normal(k).astype(F32) if with_gain else None
    dx, d_scale = rb.rms_norm_backward(jnp.asarray(x), jnp.asarray(g),
                                       None if scale is None else jnp.asarray(scale), eps=1e-6,
                                       scale_offset=0.5, config=config, interpret=True)
    assert _judge(x, g, scale, 0.5, 1e-6, dx, d_scale) <= 1.0
    assert_race_free()


def test_every_tuning_candidate_matches_float64(rng):
    """The sweep's configs (bench/norm_backward.py --configs) at a shape with several of each:
    rows per block 1-16, grids of 1-8 CTAs per SM; every one race-free and right, the
    selected config first; the partials unsummed sum to the same d scale."""
    m, k = 64, 256
    configs = rb.backward_candidates(m, k, jnp.bfloat16, num_sms=2, addend=True)
    assert configs[0] == rb.select_backward_config(m, k, jnp.bfloat16, num_sms=2, addend=True)
    assert len(configs) == len(set(configs)) >= 6
    assert {c.rows.block_m for c in configs} >= {1, 4, 16}
    x, g, stream = (rng.standard_normal((m, k)).astype(BF16) for _ in range(3))
    scale = (1 + 0.1 * rng.standard_normal(k)).astype(F32)
    for config in configs:
        dx, d_scale = rb.rms_norm_backward(jnp.asarray(x), jnp.asarray(g), jnp.asarray(scale),
                                           jnp.asarray(stream), eps=1e-6, scale_offset=0.0,
                                           config=config, interpret=True)
        assert check_rms_norm_backward(dx, d_scale, x=x, g=g, scale=scale, eps=1e-6,
                                       stream=stream) <= 1.0, config
        assert_race_free()
    _, partials = rb.rms_norm_backward(jnp.asarray(x), jnp.asarray(g), jnp.asarray(scale),
                                       jnp.asarray(stream), eps=1e-6, scale_offset=0.0,
                                       config=configs[-1], interpret=True, sum_partials=False)
    ctas = m // configs[-1].rows.block_m // configs[-1].steps
    assert partials.shape == (ctas, k)
    np.testing.assert_allclose(np.asarray(partials).sum(0), np.asarray(d_scale), rtol=1e-5,
                               atol=1e-5)


def test_selection_makes_one_wave_of_few_ctas(monkeypatch):
    """With no measured config (another GPU, or none near): Llama-3.2-1B's training norm on
    the H200 takes 1024 blocks of 4 rows in 256 CTAs of 4 blocks (two resident per SM), so
    XLA sums 256 column partials, not 1024."""
    monkeypatch.setattr(rb.backward_configs, "ENTRIES", ())
    config = rb.select_backward_config(4096, 2048, jnp.bfloat16, num_sms=hardware.H200_SMS)
    assert (config.rows.block_m, config.steps) == (4, 4)
    assert config.smem_bytes(2048, jnp.bfloat16) <= 227 * 1024 // 2


def test_selection_takes_the_measured_config_near_its_shape(monkeypatch):
    """A measured entry gives its rows per block and CTA count at M within 2x (blocks per CTA
    scaled to M), only for its K, dtype and SM count; the heuristic elsewhere."""
    monkeypatch.setattr(rb.backward_configs, "PROVENANCE", {"sms": hardware.H200_SMS})
    monkeypatch.setattr(rb.backward_configs, "ENTRIES",
                        (((2048, 1152), "bfloat16", 2, 4, 0.48, 0.74),))
    select = functools.partial(rb.select_backward_config, k=1152, dtype=jnp.bfloat16)
    at = select(2048, num_sms=hardware.H200_SMS, addend=True)
    assert (at.rows.block_m, at.steps, at.addend) == (2, 4, True)
    twice = select(4096, num_sms=hardware.H200_SMS)
    assert (twice.rows.block_m, 4096 // 2 // twice.steps) == (2, 256)
    heuristic = rb._one_wave_config(8192, 1152, jnp.bfloat16, num_sms=hardware.H200_SMS,
                                    addend=False)
    assert select(8192, num_sms=hardware.H200_SMS) == heuristic  # M 4x away
    other_gpu = select(2048, num_sms=hardware.H200_SMS - 18)
    assert other_gpu == rb._one_wave_config(2048, 1152, jnp.bfloat16,
                                            num_sms=hardware.H200_SMS - 18, addend=False)
    assert rb._measured_config(2048, 1024, jnp.bfloat16, num_sms=hardware.H200_SMS,
                               addend=False) is None  # another K: no entry applies


@pytest.mark.parametrize("m, k, with_gain", [(16, 512, True), (6, 320, False)])
def test_addend_is_added_to_dx(rng, m, k, with_gain):
    """x's other cotangent (the residual stream's) added in the kernel, before dx rounds."""
    x, g, stream = (rng.standard_normal((m, k)).astype(BF16) for _ in range(3))
    scale = rng.standard_normal(k).astype(F32) if with_gain else None
    dx, d_scale = dispatch.call(OP, "interpret", jnp.asarray(x), jnp.asarray(g),
                                None if scale is None else jnp.asarray(scale), jnp.asarray(stream),
                                eps=1e-6, scale_offset=0.0)
    assert check_rms_norm_backward(dx, d_scale, x=x, g=g, scale=scale, eps=1e-6,
                                   stream=stream) <= 1.0
    assert_race_free()


@pytest.mark.parametrize("m, k, with_gain, cotangents, stream", [
    (16, 512, True, 2, True), (6, 320, False, 3, True), (8, 256, True, 2, False)])
def test_consumers_cotangents_are_summed_in_the_kernel(rng, m, k, with_gain, cotangents,
                                                        stream):
    """G as one cotangent per consumer of the normed x (gate and up; q, k and v), summed in
    float32 as the kernel reads them: judged against the float64 VJP of their exact sum."""
    x, r = (rng.standard_normal((m, k)).astype(BF16) for _ in range(2))
    gs = [rng.standard_normal((m, k)).astype(BF16) for _ in range(cotangents)]
    scale = rng.standard_normal(k).astype(F32) if with_gain else None
    dx, d_scale = dispatch.call(OP, "interpret", jnp.asarray(x), tuple(map(jnp.asarray, gs)),
                                None if scale is None else jnp.asarray(scale),
                                *([jnp.asarray(r)] if stream else []), eps=1e-6,
                                scale_offset=0.0)
    g = sum(gi.astype(np.float64) for gi in gs)
    assert check_rms_norm_backward(dx, d_scale, x=x, g=g, scale=scale, eps=1e-6,
                                   stream=r if stream else None) <= 1.0
    assert_race_free()


def test_config_and_cotangents_given_must_agree():
    config = rb.select_backward_config(16, 512, jnp.bfloat16, num_sms=2, cotangents=2)
    assert config.cotangents == 2
    x = jnp.ones((16, 512), jnp.bfloat16)
    with pytest.raises(ValueError, match="config.cotangents=2 but 3 given"):
        rb.rms_norm_backward(x, (x, x, x), None, eps=1e-6, scale_offset=0.0, config=config,
                             interpret=True)
    with pytest.raises(ValueError, match="cotangents must be >= 1"):
        rb.BackwardConfig(config.rows, cotangents=0)


@pytest.mark.parametrize("m, k, cotangents", [(4096, 2048, 2), (4096, 2048, 3),
                                              (2048, 1152, 3), (4096, 4096, 3)])
def test_cotangents_lower_at_a_training_shape(m, k, cotangents):
    """The attention input's three cotangents and the MLP input's two, with the stream's,
    at the presets' d_model rows: one launch, its tiles within shared memory."""
    S = jax.ShapeDtypeStruct
    config = rb.select_backward_config(m, k, jnp.bfloat16, num_sms=hardware.H200_SMS,
                                       addend=True, cotangents=cotangents)
    assert config.smem_bytes(k, jnp.bfloat16) <= rb._MAX_SMEM_BYTES
    fn = functools.partial(rb.rms_norm_backward, eps=1e-6, scale_offset=0.0, config=config)
    a = S((m, k), jnp.bfloat16)
    with jax.sharding.use_abstract_mesh(hardware.h200_mesh()):
        lowered = jax.jit(fn).trace(a, (a,) * cotangents, S((k,), jnp.float32), a).lower(
            lowering_platforms=("cuda",))
    assert lowered.as_text().count("custom_call @mosaic_gpu_v2(") == 1


def test_addend_lowers_at_a_training_shape():
    S = jax.ShapeDtypeStruct
    config = rb.select_backward_config(4096, 2048, jnp.bfloat16, num_sms=hardware.H200_SMS,
                                       addend=True)
    fn = functools.partial(rb.rms_norm_backward, eps=1e-6, scale_offset=0.0, config=config)
    a = S((4096, 2048), jnp.bfloat16)
    with jax.sharding.use_abstract_mesh(hardware.h200_mesh()):
        lowered = jax.jit(fn).trace(a, a, S((2048,), jnp.float32), a).lower(
            lowering_platforms=("cuda",))
    assert lowered.as_text().count("custom_call @mosaic_gpu_v2(") == 1


def test_a_launch_saving_too_little_is_declined(monkeypatch):
    """Faster by ratio but saving under MIN_SAVED_US a launch (Gemma-3-1B's rows): declined,
    with the saving in the reason, since each launch costs the step's wall time."""
    from jaxnorm.backends import mosaic_norm_backward

    S = jax.ShapeDtypeStruct
    x, scale = S((2048, 1152), jnp.bfloat16), S((1152,), jnp.float32)
    monkeypatch.setattr(norm_backward_measured, "PROVENANCE", {"sms": hardware.H200_SMS})
    for saved, taken in ((4.6, False), (mosaic_norm_backward.MIN_SAVED_US, True)):
        monkeypatch.setattr(norm_backward_measured, "ENTRIES",
                            (((2048, 1152), "bfloat16", True, False, 1, 0.77, saved),))
        with jax.sharding.use_abstract_mesh(hardware.h200_mesh()):
            impl, reason = dispatch.decide(OP, x, x, scale, eps=1e-6, scale_offset=0.0)
        assert (impl == "mosaic") == taken, reason
        if not taken:
            assert "saved 4.6 us a launch" in reason
