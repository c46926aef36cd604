"""GPU checks of RMSNorm's backward kernel at the presets' training norms."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from bench.gpu.kernel_checks.common import BF16, IMPL, Case, assert_bitwise, draw, sized
from verify import checks


# RMSNorm's backward at the presets' training norms (full) and small stand-ins (SMOKE), and
# whether they are d_model rows, where the residual stream's cotangent joins the norm's:
# d_model rows of Llama-3.2-1B, Qwen3-0.6B, Gemma-3-1B, Llama-3-8B, and QK-norm heads
# (Qwen3-0.6B's, Gemma-3-1B's query heads).
NORM_BACKWARD_SHAPES = [((4096, 2048), (8, 512), True), ((4096, 1024), (16, 256), True),
                        ((2048, 1152), (12, 1152), True), ((4096, 4096), (4, 1024), True),
                        ((65536, 128), (64, 128), False), ((8192, 256), (32, 256), False)]


def norm_backward_cases() -> list[Case]:
    """correct / NaN isolated / repeatable for RMSNorm's backward kernel (op
    "rms_norm_backward" under IMPL), judged by verify against the float64 VJP of rms_norm;
    at d_model rows also with the residual stream's cotangent added in the kernel, as the
    fused model's training step runs it (`return_input=True`), alone and with G as the
    cotangents of two and three consumers (gate and up; q, k and v) summed in it."""
    from jaxnorm import dispatch

    def inputs(seed: int, m: int, k: int, gain: bool, stream: bool, cotangents: int):
        rng = np.random.default_rng(seed)
        x = draw(rng, (m, k), BF16)
        gs = tuple(draw(rng, (m, k), BF16) for _ in range(cotangents))
        return (x, gs if cotangents > 1 else gs[0],
                (1 + 0.2 * rng.standard_normal(k)).astype(np.float32) if gain else None,
                draw(rng, (m, k), BF16) if stream else None)

    def run(x, g, scale, r):
        g = tuple(map(jnp.asarray, g)) if isinstance(g, tuple) else jnp.asarray(g)
        return dispatch.call("rms_norm_backward", IMPL, jnp.asarray(x), g,
                             None if scale is None else jnp.asarray(scale),
                             *(() if r is None else (jnp.asarray(r),)), eps=1e-6,
                             scale_offset=0.0)

    def judge(x, g, scale, r, dx, d_scale) -> str:
        if isinstance(g, tuple):  # the consumers' cotangents: their exact sum
            g = sum(np.asarray(gi, np.float64) for gi in g)
        ratio = checks.check_rms_norm_backward(dx, d_scale, x=x, g=g, scale=scale, eps=1e-6,
                                               stream=r)
        return f"err/tol {ratio:.3f}"

    def rows_of(g, keep):
        return tuple(np.asarray(gi)[keep] for gi in g) if isinstance(g, tuple) else (
            np.asarray(g)[keep])

    cases = []
    for i, (full, smoke, d_model_rows) in enumerate(NORM_BACKWARD_SHAPES):
        m, k = sized(full, smoke)
        forms = [(True, False, 1), (False, False, 1)] + (
            [(True, True, 1), (True, True, 2), (True, True, 3)] if d_model_rows else [])
        for gain, stream, cotangents in forms:
            label = (f"rms_norm_backward {m}x{k} {'gain' if gain else 'folded'}"
                     f"{' + stream' if stream else ''}"
                     f"{f', {cotangents} cotangents' if cotangents > 1 else ''}")
            seed = 1000 + 10 * i + gain + 4 * stream + 100 * (cotangents - 1)

            def correct(m=m, k=k, gain=gain, stream=stream, cotangents=cotangents, seed=seed):
                x, g, scale, r = inputs(seed, m, k, gain, stream, cotangents)
                return judge(x, g, scale, r, *run(x, g, scale, r))

            def nan_isolated(m=m, k=k, gain=gain, stream=stream, cotangents=cotangents,
                             seed=seed):
                x, g, scale, r = inputs(seed + 1, m, k, gain, stream, cotangents)
                x = np.array(x)
                x[m // 2, k // 3] = np.nan
                dx = np.asarray(run(x, g, scale, r)[0], np.float32)
                nan_rows = np.flatnonzero(np.isnan(dx).any(axis=1))
                if list(nan_rows) != [m // 2] or not np.isnan(dx[m // 2]).all():
                    raise AssertionError(f"NaN rows {list(nan_rows)[:8]}, expected [{m // 2}]")
                keep = np.arange(m) != m // 2  # d scale sums the NaN row: NaN, as in float64
                return judge(x[keep], rows_of(g, keep), scale,
                             None if r is None else np.asarray(r)[keep], dx[keep], None)

            def repeatable(m=m, k=k, gain=gain, stream=stream, cotangents=cotangents,
                           seed=seed):
                x, g, scale, r = inputs(seed + 2, m, k, gain, stream, cotangents)
                assert_bitwise(run(x, g, scale, r), run(x, g, scale, r), "second call")
                return "bitwise"

            cases += [("correct", label, correct), ("NaN isolated", label, nan_isolated),
                      ("repeatable", label, repeatable)]
    return cases
