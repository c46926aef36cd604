"""The decode gated kernel (M <= 64, `pallas_kernels.decode_gated`) under the Mosaic GPU
interpreter with race detection, judged by verify's float64 reference of the gated MLP input.

Uninitialized memory reads as NaN in the interpreter, so an element no unit writes fails the
judge. N = 576 over 64-column tiles is nine units on the interpreter's four CTAs (one CTA
runs three, refilling a bias buffer after the MMA warpgroup frees it); N = 192 over 128-column tiles ends in a half tile (pieces past N
are skipped); K = 256 is four K steps through a three-slot ring, K = 64 a single step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from jaxnorm.backends import decode_gated_measured, mosaic_gated
from kernel_checks import assert_race_free
from pallas_kernels import decode_config as dc
from pallas_kernels import decode_gated as dg
from pallas_kernels import hardware
from pallas_kernels.errors import Unsupported
from pallas_kernels.lazy_norm_matmul import rms_row_scale
from verify import gated as vg

BF16, F16 = jnp.bfloat16, jnp.float16


def _inputs(rng, m, k, n, dtype=BF16, *, gain, biases) -> tuple[dict, dict]:
    """Fresh draws; gain: None (folded or absent), "plain" (1 + 0.2 z) or "gemma" ((1 + g)
    with g = 0.2 z, scale_offset 1)."""
    g = None if gain is None else 0.2 * rng.standard_normal(k) + (gain == "plain")
    return dict(
        x=jnp.asarray(rng.standard_normal((m, k)) + 0.2, dtype),
        scale=None if g is None else jnp.asarray(g, jnp.float32),
        gate_kernel=jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), dtype),
        up_kernel=jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), dtype),
        gate_bias=jnp.asarray(rng.standard_normal(n), jnp.float32) if "g" in biases else None,
        up_bias=jnp.asarray(rng.standard_normal(n), jnp.float32) if "u" in biases else None,
    ), dict(scale_offset=1.0 if gain == "gemma" else 0.0)


# (M, K, N, tile_n, warpgroups, activation, gain, biases): every M of the issue, each
# activation with the statistic in the kernel (gain None) and with a gain scaling x in XLA.
CASES = {
    "M1_N576_silu_stat_in_kernel_biases": (1, 256, 576, 64, 1, "silu", None, "gu"),
    "M1_N192_gelu_tanh_gemma_gain": (1, 256, 192, 128, 1, "gelu_tanh", "gemma", ""),
    "M7_N192_gelu_tanh_stat_in_kernel": (7, 256, 192, 128, 1, "gelu_tanh", None, ""),
    "M7_K64_silu_one_k_step": (7, 64, 128, 64, 1, "silu", None, "u"),
    "M16_N256_gelu_stat_in_kernel_two_warpgroups": (16, 256, 256, 64, 2, "gelu", None, "g"),
    "M16_N320_silu_gain_biases": (16, 256, 320, 64, 1, "silu", "plain", "gu"),
    "M64_N384_silu_stat_in_kernel_up_bias": (64, 256, 384, 64, 1, "silu", None, "u"),
    "M64_N192_gelu_gain_two_warpgroups": (64, 256, 192, 64, 2, "gelu", "plain", "gu"),
    "M64_N320_gelu_tanh_stat_in_kernel_biases": (64, 192, 320, 64, 1, "gelu_tanh", None, "gu"),
}


# (M, K, N, tile_n, warpgroups, activation, gain, biases): the K splits in a cluster of 2 (the
# interpreter's widest), rank 0 summing both streams' partials (and the splits' sums of
# squares, gain None) before act(gate) * up.
CLUSTER_CASES = {
    "M1_N576_silu_biases": (1, 256, 576, 64, 1, "silu", None, "gu"),
    "M8_N192_gelu_tanh_gemma_gain": (8, 256, 192, 128, 1, "gelu_tanh", "gemma", ""),
    "M16_N256_gelu_two_warpgroups": (16, 256, 256, 64, 2, "gelu", None, "g"),
    "M64_N384_silu_gain": (64, 256, 384, 64, 1, "silu", "plain", "u"),
}


# (id, case, the config's split): every case unsplit, then each cluster case split two ways.
VARIANTS = ([(name, case, {}) for name, case in CASES.items()]
            + [(f"cluster_{name}", case, dict(split_k=2, reduction="cluster"))
               for name, case in CLUSTER_CASES.items()])


@pytest.mark.parametrize("case, split", [v[1:] for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_decode_gated_matches_float64(case, split, rng):
    m, k, n, tile_n, warpgroups, activation, gain, biases = case
    inputs, kw = _inputs(rng, m, k, n, gain=gain, biases=biases)
    config = dc.DecodeConfig(tile_n=tile_n, stages=3, warpgroups=warpgroups, **split)
    y = dg.decode_gated_rms_matmul(
        inputs["x"], inputs["gate_kernel"], inputs["up_kernel"], activation=activation,
        scale=inputs["scale"], gate_bias=inputs["gate_bias"], up_bias=inputs["up_bias"],
        config=config, interpret=True, **kw)
    assert_race_free()
    assert y.shape == (m, n) and y.dtype == BF16
    assert vg.check_gated(y, **inputs, activation_name=activation, act_dtype=np.float32,
                          **kw) <= 1.0


def test_given_row_scale_replaces_the_statistic(rng):
    """2 r given: RMSNorm(x) with a gain of 2 (f16, M = 13 in a 16-row box)."""
    inputs, _ = _inputs(rng, 13, 128, 128, F16, gain=None, biases="")
    x = inputs["x"]
    y = dg.decode_gated_rms_matmul(x, inputs["gate_kernel"], inputs["up_kernel"],
                                   row_scale=2 * rms_row_scale(x, 1e-6),
                                   config=dc.DecodeConfig(tile_n=64, stages=2), interpret=True)
    assert_race_free()
    assert vg.check_gated(y, **dict(inputs, scale=np.full(128, 2.0, np.float32)),
                          act_dtype=np.float32) <= 1.0


def test_a_nan_row_poisons_only_its_output_row(rng):
    """The in-kernel statistic keeps rows apart: NaN exactly where the reference has it."""
    inputs, _ = _inputs(rng, 8, 128, 128, gain=None, biases="gu")
    inputs["x"] = inputs["x"].at[3, 17].set(jnp.nan)
    y = dg.decode_gated_rms_matmul(inputs["x"], inputs["gate_kernel"], inputs["up_kernel"],
                                   gate_bias=inputs["gate_bias"], up_bias=inputs["up_bias"],
                                   config=dc.DecodeConfig(tile_n=64, stages=2), interpret=True)
    assert np.isnan(np.asarray(y, np.float32)[3]).all()
    assert vg.check_gated(y, **inputs, act_dtype=np.float32) <= 1.0


def test_op_serves_decode_rows_with_the_decode_gated_kernel(rng, monkeypatch):
    """jaxnorm's rms_norm_gated_dense (impl="interpret") at M <= 64 runs the decode kernel."""
    calls = []
    original = dg.decode_gated_rms_matmul
    monkeypatch.setattr(dg, "decode_gated_rms_matmul",
                        lambda *a, **kw: calls.append(1) or original(*a, **kw))
    inputs, kw = _inputs(rng, 5, 128, 192, gain="gemma", biases="g")
    y = jaxnorm.rms_norm_gated_dense(*inputs.values(), activation="gelu_tanh",
                                     impl="interpret", **kw)
    assert_race_free()
    assert calls
    assert vg.check_gated(y, **inputs, activation_name="gelu_tanh", act_dtype=np.float32,
                          **kw) <= 1.0


def test_op_runs_the_config_its_measured_ratio_is_of(rng, monkeypatch):
    """At decode the op runs the nearest measured shape's fastest config (here K splits in a
    cluster), not the modelled pick; right against float64 with it."""
    fields = dict(tile_n=64, tile_k=64, split_k=2, stages=3, warpgroups=1, reduction="cluster")
    monkeypatch.setattr(decode_gated_measured, "ENTRIES",
                        (((8, 128, 192), "silu", 0.5, 0.6, fields),))
    monkeypatch.setattr(decode_gated_measured, "PROVENANCE", {"sms": hardware.num_sms()})
    configs = []
    original = dg.decode_gated_rms_matmul
    monkeypatch.setattr(dg, "decode_gated_rms_matmul",
                        lambda *a, **kw: configs.append(kw.get("config")) or original(*a, **kw))
    inputs, kw = _inputs(rng, 7, 128, 192, gain=None, biases="")
    y = jaxnorm.rms_norm_gated_dense(*inputs.values(), impl="interpret", **kw)
    assert_race_free()
    assert configs == [dc.DecodeConfig(**fields)]
    assert vg.check_gated(y, **inputs, act_dtype=np.float32, **kw) <= 1.0


def _gate(k: int, n: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((k, n), BF16)


def test_automatic_dispatch_at_decode_follows_the_measured_table(monkeypatch):
    """Kernel where the nearest measured shape (within 2x in M, K and d_ff) was at most
    DECODE_MAX_RATIO of stock with the call's gain state; the reason everywhere else."""
    monkeypatch.setattr(decode_gated_measured, "ENTRIES", (
        ((1, 1024, 3072), "silu", 0.42, 0.95, None), ((8, 2048, 8192), "silu", 0.93, None, None)))
    monkeypatch.setattr(decode_gated_measured, "PROVENANCE", {"sms": hardware.num_sms()})
    gain = jnp.ones((1024,), BF16)
    decline = functools.partial(mosaic_gated._not_measured_faster, activation="silu")
    assert decline(jnp.ones((2, 1024), BF16), None, _gate(1024, 3072)) is None  # folded 0.42
    assert decline(jnp.ones((1, 1500), BF16), None, _gate(1500, 4096)) is None
    reason = decline(jnp.ones((1, 1024), BF16), gain, _gate(1024, 3072))
    assert "0.950x" in reason and "gain unfolded" in reason and "impl='mosaic'" in reason
    reason = decline(jnp.ones((8, 2048), BF16), None, _gate(2048, 8192))
    assert "0.930x" in reason and "above 0.9x" in reason
    reason = decline(jnp.ones((8, 2048), BF16), gain, _gate(2048, 8192))
    assert "not yet measured" in reason
    reason = decline(jnp.ones((4, 1024), BF16), None, _gate(1024, 3072))  # 4x from M = 1
    assert "no measured shape within 2x" in reason
    monkeypatch.setattr(decode_gated_measured, "PROVENANCE", {"sms": 1})
    assert "no measured shape" in decline(jnp.ones((1, 1024), BF16), None, _gate(1024, 3072))


def test_the_measured_table_is_consistent():
    """Each entry is a decode shape the kernel serves, with ratios that are None or positive
    and a config the kernel takes at that shape."""
    assert decode_gated_measured.PROVENANCE["device"].startswith("NVIDIA")
    for (m, k, n), activation, *ratios, fields in decode_gated_measured.ENTRIES:
        assert 1 <= m <= dg.MAX_ROWS and k % 64 == 0 and n % 64 == 0
        assert activation in dg.ACTIVATIONS
        assert all(r is None or r > 0 for r in ratios)
        x, w = jax.ShapeDtypeStruct((m, k), BF16), jax.ShapeDtypeStruct((k, n), BF16)
        dg.check_decode_gated_shapes(x, w, w, dc.DecodeConfig(**fields))


@pytest.mark.parametrize("m", [1, 8, 64])
@pytest.mark.parametrize("k, n", [(2048, 8192), (1024, 3072), (2560, 9728), (4096, 14336),
                                  (1152, 6912)])
def test_selection_is_valid_at_the_presets(m, k, n):
    config = dg.gated_decode_config(m, k, n)
    w = jax.ShapeDtypeStruct((k, n), BF16)
    dg.check_decode_gated_shapes(jax.ShapeDtypeStruct((m, k), BF16), w, w, config)
    assert dc.smem_bytes(config, 2, streams=2) <= hardware.SMEM_BYTES_PER_CTA
    assert config.stages >= 2 and config.split_k == 1


@pytest.mark.parametrize("change, reason", [
    (dict(config=dc.DecodeConfig(tile_n=64, split_k=2)), "split_k=2 must be 1 unless"),
    (dict(config=dc.DecodeConfig(tile_n=256, stages=2)), "tile_n=256 must be <= 128"),
    (dict(config=dc.DecodeConfig(tile_n=128, stages=4, warpgroups=2)), "shared memory"),
    (dict(activation="relu"), "activation 'relu' not served"),
    (dict(w_up=jnp.zeros((128, 192), BF16)), "must have one shape"),
    (dict(x=jnp.zeros((65, 128), BF16)), "M=65 must be in"),
])
def test_unsupported_says_why(change, reason):
    args = dict(x=jnp.zeros((4, 128), BF16), w_gate=jnp.zeros((128, 128), BF16),
                w_up=jnp.zeros((128, 128), BF16))
    kwargs = {name: value for name, value in change.items() if name not in args}
    args.update({name: value for name, value in change.items() if name in args})
    with pytest.raises(Unsupported, match=reason):
        dg.decode_gated_rms_matmul(*args.values(), interpret=True, **kwargs)


def test_row_scale_shape_is_checked():
    x, w = jnp.zeros((4, 128), BF16), jnp.zeros((128, 64), BF16)
    with pytest.raises(ValueError, match="row_scale"):
        dg.decode_gated_rms_matmul(x, w, w, row_scale=jnp.ones((5,)), interpret=True)
