"""bench/gpu/gain_reduction_probe.py: its three writings are one norm, its variant one model."""

import json

import jax
import jax.numpy as jnp
import numpy as np

from bench.gpu import gain_reduction_probe as probe
from jaxnorm.backends import xla
from verify.references import f64


def test_the_writings_compute_one_rms_norm_against_float64():
    keys = jax.random.split(jax.random.key(1), 2)
    x = jax.random.normal(keys[0], (2, 512, 96), jnp.bfloat16) * 3.0
    gain = jax.random.normal(keys[1], (96,), jnp.float32) * 0.2
    x64 = f64(x)
    want = x64 / np.sqrt(np.mean(x64 * x64, -1, keepdims=True) + probe.EPS) * (1.0 + f64(gain))
    for got in (probe.norm_rows(x, gain), probe.norm_rows(x.reshape(1024, 96), gain),
                probe.norm_rows_viewed(x.reshape(1024, 96), gain)):
        np.testing.assert_allclose(np.asarray(got, np.float64).reshape(want.shape), want,
                                   rtol=2**-7, atol=2**-7)
    assert probe.rows_view(2048) == (2, 1024) and probe.rows_view(24) == (3, 8)


def test_the_view_variant_is_the_xla_normalization():
    x = jax.random.normal(jax.random.key(2), (40, 64), jnp.bfloat16)
    scale = jax.random.normal(jax.random.key(3), (64,), jnp.float32)
    with probe.gain_view():
        viewed = xla.rms_normalized_f32(x, scale, 1e-6, 1.0)
    np.testing.assert_allclose(viewed, xla.rms_normalized_f32(x, scale, 1e-6, 1.0), rtol=1e-6)
    assert xla.rms_normalized_f32 is not probe.view_f32  # restored


def test_gain_reductions_names_each_by_emitter():
    hlo = "\n".join([
        '  %input_reduce_fusion.78 = bf16[1152]{0} fusion(%a), kind=kCustom, calls=%f, '
        'backend_config={"fusion_backend_config":{"kind":"__triton"}}',
        "  %input_reduce_fusion.83 = bf16[1152]{0} fusion(%b), kind=kInput, calls=%g",
        "  %loop_fusion.2 = bf16[1152,4]{1,0} fusion(%c), kind=kLoop, calls=%h"])
    assert probe.gain_reductions(hlo, 1152) == {"input_reduce_fusion_78": "triton",
                                                "input_reduce_fusion_83": "kInput"}


def test_main_runs_on_the_tiny_model(tmp_path):
    """CPU: the code paths (timings mean nothing; no CUPTI)."""
    probe.main(["--model", "tiny", "--rounds", "1", "--repeats", "2", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "gain-reduction-tiny.json").read_text())
    step = result["training step"]
    assert set(step["emitters"]) == {"stock", "jaxnorm", probe.VIEW}
    assert step["emitters"]["stock"]["gain_reductions"] > 0
    assert {row["variant"] for row in step["rows"]} == {"stock", "jaxnorm", probe.VIEW}
    assert set(result["single norm"]) == {"stock 3-D", "ours 2-D", "2-D, gain on a 3-D view"}
