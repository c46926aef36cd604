"""GPU checks of the gated MLP input (norm, gate/up, activation * up in one epilogue) at
prefill and decode sizes, judged by verify.gated."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from bench.gpu.kernel_checks.common import (ALL_CHECKS, BF16, F16, F32, IMPL, INTERPRET, SMOKE,
                                            Case, assert_bitwise, draw, sized)


# The gated MLP input (jaxnorm.rms_norm_gated_dense): (full size M, K, d_ff), smoke size,
# activation, dtype, Gemma gain offset, biases: rows not a multiple of the tile, decode, f16.
GATED_CASES = [
    ((2048, 2048, 8192), (130, 128, 192), "silu", BF16, 0.0, True),
    ((1000, 4096, 14336), (64, 64, 64), "gelu_tanh", BF16, 1.0, False),
    ((4096, 1024, 3072), (130, 64, 128), "gelu", F16, 0.0, True),
    ((16, 2048, 8192), (1, 128, 128), "silu", BF16, 0.0, False),
]


def gated_inputs(seed: int, m: int, k: int, n: int, dtype, gain: str | None,
                  biases: bool) -> dict[str, Any]:
    """rms_norm_gated_dense's inputs; gain: None (folded or absent), "plain" (1 + 0.2 z) or
    "gemma" (0.2 z, applied as 1 + g)."""
    rng = np.random.default_rng(seed)
    scale = None if gain is None else draw(rng, (k,), F32, 0.2, 1.0 if gain == "plain" else 0.0)
    return dict(x=draw(rng, (m, k), dtype), scale=scale,
                gate_kernel=draw(rng, (k, n), dtype, 1 / np.sqrt(k)),
                up_kernel=draw(rng, (k, n), dtype, 1 / np.sqrt(k)),
                gate_bias=draw(rng, (n,), F32) if biases else None,
                up_bias=draw(rng, (n,), F32) if biases else None)


def gated_checks(label: str, inputs: Callable[[int], dict[str, Any]], activation: str,
                  offset: float, seeds: tuple[int, int, int], checks: tuple[str, ...],
                  config=None) -> list[Case]:
    """correct / NaN isolated / repeatable of jaxnorm.rms_norm_gated_dense under IMPL (or, with
    a decode `config`, the decode gated kernel with it) on `inputs(seed)`, judged by
    verify.gated (the epilogue's act(g) * u in float32)."""
    import jaxnorm
    from pallas_kernels import decode_gated
    from verify import gated

    def run(a):
        if config is None:
            return jaxnorm.rms_norm_gated_dense(*a.values(), activation=activation,
                                                scale_offset=offset, impl=IMPL)
        x, scale, wg, wu, bg, bu = (None if v is None else jnp.asarray(v) for v in a.values())
        return decode_gated.decode_gated_rms_matmul(
            x, wg, wu, activation=activation, scale=scale, scale_offset=offset, gate_bias=bg,
            up_bias=bu, config=config, interpret=INTERPRET)

    def judge(a):
        ratio = gated.check_gated(run(a), **a, activation_name=activation,
                                  scale_offset=offset, act_dtype=F32)
        return f"err/tol {ratio:.3f}"

    def correct():
        return judge(inputs(seeds[0]))

    def nan_isolated():
        a = inputs(seeds[1])
        m, k = a["x"].shape
        a["x"] = np.array(a["x"])
        a["x"][m // 2, k // 3] = np.nan
        return judge(a)

    def repeatable():
        a = inputs(seeds[2])
        assert_bitwise(run(a), run(a), "second call")
        return "bitwise"

    fns = {"correct": correct, "NaN isolated": nan_isolated, "repeatable": repeatable}
    return [(check, label, fns[check]) for check in checks]


def gated_cases() -> list[Case]:
    """correct / NaN isolated / repeatable for the gated gate/up kernel (verify.gated's judge)."""
    cases = []
    for i, (full, smoke, activation, dtype, offset, biases) in enumerate(GATED_CASES):
        m, k, n = sized(full, smoke)
        label = f"gated_mlp_in {activation} {m}x{k}x({n}+{n}) {jnp.dtype(dtype).name}"
        inputs = functools.partial(gated_inputs, m=m, k=k, n=n, dtype=dtype,
                                   gain="gemma" if offset else "plain", biases=biases)
        cases += gated_checks(label, inputs, activation, offset, (300 + i, 400 + i, 500 + i),
                               ALL_CHECKS)
    return cases


# The decode gated kernel (M <= 64, pallas_kernels/decode_gated.py) at the presets' decode MLP
# shapes: (K, d_ff, activation) of Llama-3.2-1B, Qwen3-0.6B, Qwen3-4B, Llama-3-8B, Gemma-3-1B,
# smoke (K, d_ff); the gain folded (the row statistic in the kernel), no biases, as the models
# call it; then a gain scaling x in XLA with biases. NaN isolated / repeatable at M = 8.
DECODE_GATED_PRESETS = [((2048, 8192), (128, 192), "silu"), ((1024, 3072), (64, 128), "silu"),
                        ((2560, 9728), (128, 320), "silu"), ((4096, 14336), (192, 192), "silu"),
                        ((1152, 6912), (128, 192), "gelu_tanh")]
DECODE_GATED_ROWS = (1, 8, 64)
# (M, K, d_ff) full and smoke, activation, gain ("plain" or "gemma"), biases.
DECODE_GATED_VARIANTS = [((8, 1152, 6912), (8, 128, 192), "gelu_tanh", "gemma", False),
                         ((64, 2048, 8192), (64, 128, 192), "silu", "plain", True),
                         ((1, 1024, 3072), (1, 64, 128), "gelu", "plain", True)]


def decode_gated_cases() -> list[Case]:
    """correct (every preset and M), NaN isolated and repeatable (M = 8) for the decode
    gated kernel through jaxnorm.rms_norm_gated_dense, judged by verify.gated."""
    specs = [((m, *full), (m, *smoke), activation, None, False)
             for full, smoke, activation in DECODE_GATED_PRESETS for m in DECODE_GATED_ROWS]
    specs += DECODE_GATED_VARIANTS
    cases = []
    for i, (full, smoke, activation, gain, biases) in enumerate(specs):
        m, k, n = sized(full, smoke)
        label = (f"decode gated {activation} {m}x{k}x({n}+{n}) "
                 f"{'gain ' + gain if gain else 'gain folded'}{' +biases' if biases else ''}")
        inputs = functools.partial(gated_inputs, m=m, k=k, n=n, dtype=BF16, gain=gain,
                                   biases=biases)
        cases += gated_checks(label, inputs, activation, 1.0 if gain == "gemma" else 0.0,
                               (700 + i, 800 + i, 900 + i),
                               ALL_CHECKS if m == 8 else ("correct",))
    return cases


# The decode gated kernel with its K splits summed in a cluster (rank 0 adds gate's and up's
# partials through DSMEM): (M, K, d_ff), activation, split, tile_n; the gain folded.
DECODE_GATED_CLUSTER = [((8, 1024, 3072), "silu", 5, 128), ((8, 2048, 8192), "silu", 2, 128),
                        ((1, 1152, 6912), "gelu_tanh", 2, 64), ((64, 1024, 3072), "silu", 2, 64)]


def decode_gated_cluster_cases() -> list[Case]:
    """correct, NaN isolated and repeatable for the decode gated kernel with cluster splits."""
    from pallas_kernels import decode_config as dc

    cases = []
    for i, (full, activation, split, tile_n) in enumerate(DECODE_GATED_CLUSTER):
        m, k, n = sized(full, (full[0], 256, 128))
        config = dc.deepest(dc.DecodeConfig(tile_n=tile_n, split_k=2 if SMOKE else split,
                                            reduction="cluster"), 2, streams=2)
        label = (f"decode gated cluster {activation} {m}x{k}x({n}+{n}) n{tile_n} "
                 f"s{config.split_k}")
        inputs = functools.partial(gated_inputs, m=m, k=k, n=n, dtype=BF16, gain=None,
                                   biases=i % 2 == 0)
        cases += gated_checks(label, inputs, activation, 0.0, (1700 + i, 1800 + i, 1900 + i),
                               ALL_CHECKS, config=config)
    return cases
