"""GPU checks of the residual GEMM's statistics and the post-norm kernel's statistics of its
output, each fed to the next pre-norm GEMM (`statistics=`)."""

from __future__ import annotations

import numpy as np

from bench.gpu.kernel_checks.common import (BF16, F32, IMPL, Case, assert_bitwise, draw,
                                            sized)
from bench.gpu.kernel_checks.ops import op_inputs
from verify import checks
from verify import residual as vr


# (full size, smoke size, row mean): residual_dense, its statistics judged as the kernel's
# (of the float32 h), then fed to rms_norm_dense / layer_norm_dense(statistics=...).
# M stays small enough for the float64 judge (a few M K N products on the host).
RESIDUAL_CASES = [((2048, 4096, 4096), (130, 128, 512), 0.0),
                  ((1024, 14336, 4096), (64, 256, 256), 0.0),
                  ((2048, 4096, 2048), (130, 64, 256), 1e3),
                  # Decode: the decode GEMM's product, h's statistics in XLA (split 1 and 8).
                  ((1, 2048, 2048), (1, 128, 192), 0.0),
                  ((7, 8192, 2048), (7, 256, 128), 3.0)]


def residual_cases() -> list[Case]:
    import jaxnorm

    cases = []
    for i, (full, smoke, mean) in enumerate(RESIDUAL_CASES):
        m, k, n = sized(full, smoke)

        def inputs_of(seed, m=m, k=k, n=n, mean=mean):
            rng = np.random.default_rng(seed)
            sign = np.where(rng.random((m, 1)) < 0.5, -1.0, 1.0)
            return dict(x=draw(rng, (m, k), BF16), kernel=draw(rng, (k, n), BF16, k**-0.5),
                        residual=draw(rng, (m, n), BF16, shift=mean * sign),
                        bias=draw(rng, (n,), F32))

        def run(inputs):
            return jaxnorm.residual_dense(inputs["x"], inputs["kernel"], inputs["residual"],
                                          inputs["bias"], impl=IMPL)

        def judged(inputs):
            h, stats = run(inputs)
            source = vr.source_of(IMPL, inputs["x"].shape[0])
            return max(checks._ratio(j) for j in vr.judge_residual(h, stats, source,
                                                                   **inputs)), h, stats

        def correct(i=i, k=k, n=n, inputs_of=inputs_of):
            inputs = inputs_of(300 + i)
            ratio, h, stats = judged(inputs)
            rng = np.random.default_rng(400 + i)
            norm = dict(kernel=draw(rng, (n, k), BF16, n**-0.5), bias=None, eps=1e-6,
                        scale=draw(rng, (n,), F32, 0.2, 1.0))
            y = jaxnorm.rms_norm_dense(h, norm["scale"], norm["kernel"], statistics=stats,
                                       impl=IMPL)
            consumer = vr.check_consumer("rms_norm_dense", y, IMPL, x=h, **norm)
            return f"err/tol {ratio:.3f}; rms_norm_dense(statistics=) err/tol {consumer:.3f}"

        def nan_isolated(i=i, m=m, k=k, inputs_of=inputs_of):
            inputs = inputs_of(500 + i)
            inputs["x"] = np.array(inputs["x"])
            inputs["x"][m // 2, k // 3] = np.nan
            return f"err/tol {judged(inputs)[0]:.3f}"

        def repeatable(i=i, inputs_of=inputs_of):
            inputs = inputs_of(600 + i)
            assert_bitwise(run(inputs), run(inputs), "second call")
            return "bitwise"

        label = f"residual_dense {m}x{k}x{n} bfloat16{f' mean={mean:g}' if mean else ''}"
        cases += [("correct", label, correct), ("NaN isolated", label, nan_isolated),
                  ("repeatable", label, repeatable)]
    return cases


# h = r + Norm(x @ W + b) with its RowStats (`return_statistics=True`): (op, full size, smoke
# size, |mean| of the residual rows): Gemma-2-9B's post-attention and post-feedforward norms
# (d = 3584), rows of |mean|/std ~ 1e3 included; and Gemma-3-1B's down and o at decode (M <= 64:
# the decode GEMM's product, normed by XLA).
RESIDUAL_AFTER_STATS_CASES = [
    ("dense_rms_norm", (4096, 4096, 3584), (50, 128, 512), 1e3),
    ("dense_layer_norm", (4096, 4096, 3584), (64, 64, 256), 0.0),
    ("dense_rms_norm", (4096, 14336, 3584), (64, 256, 256), 0.0),
    ("dense_rms_norm", (1, 6912, 1152), (1, 192, 256), 1e3),
    ("dense_rms_norm", (8, 1024, 1152), (7, 128, 256), 0.0),
]


def residual_after_stats_cases() -> list[Case]:
    """correct / NaN isolated / repeatable for the post-norm kernel's statistics of its
    output (verify.residual's judge), and the next pre-norm GEMM fed by them."""
    import jaxnorm

    cases = []
    for i, (op, full, smoke, mean) in enumerate(RESIDUAL_AFTER_STATS_CASES):
        m, k, n = sized(full, smoke)

        def inputs_of(seed, op=op, m=m, k=k, n=n, mean=mean):
            rng = np.random.default_rng(seed)
            inputs = op_inputs(rng, op, m, k, n, BF16, residual=False)
            sign = np.where(rng.random((m, 1)) < 0.5, -1.0, 1.0)
            inputs["residual_after"] = draw(rng, (m, n), BF16, shift=mean * sign)
            return inputs

        def run(inputs, op=op):
            fn = jaxnorm.dense_rms_norm if op == "dense_rms_norm" else jaxnorm.dense_layer_norm
            vectors = [inputs["bias"], inputs["scale"]] + (
                [inputs["norm_bias"]] if op == "dense_layer_norm" else [])
            return fn(inputs["x"], inputs["kernel"], *vectors, eps=inputs["eps"],
                      residual_after=inputs["residual_after"], return_statistics=True,
                      impl=IMPL)

        def correct(i=i, op=op, k=k, n=n, inputs_of=inputs_of, run=run):
            inputs = inputs_of(700 + i)
            ratio = vr.check_post_norm_statistics(op, IMPL, **inputs)
            h, stats = run(inputs)
            rng = np.random.default_rng(800 + i)
            norm = dict(kernel=draw(rng, (n, k), BF16, n**-0.5), bias=None, eps=1e-6,
                        scale=draw(rng, (n,), F32, 0.2, 1.0))
            y = jaxnorm.rms_norm_dense(h, norm["scale"], norm["kernel"], statistics=stats,
                                       impl=IMPL)
            consumer = vr.check_consumer("rms_norm_dense", y, IMPL, source="float32", x=h,
                                         **norm)
            return f"err/tol {ratio:.3f}; rms_norm_dense(statistics=) err/tol {consumer:.3f}"

        def nan_isolated(i=i, op=op, m=m, k=k, inputs_of=inputs_of):
            inputs = inputs_of(900 + i)
            inputs["x"] = np.array(inputs["x"])
            inputs["x"][m // 2, k // 3] = np.nan
            return f"err/tol {vr.check_post_norm_statistics(op, IMPL, **inputs):.3f}"

        def repeatable(i=i, inputs_of=inputs_of, run=run):
            inputs = inputs_of(1000 + i)
            assert_bitwise(run(inputs), run(inputs), "second call")
            return "bitwise"

        label = (f"residual-after stats {op} {m}x{k}x{n} bfloat16"
                 f"{f' mean={mean:g}' if mean else ''}")
        cases += [("correct", label, correct), ("NaN isolated", label, nan_isolated),
                  ("repeatable", label, repeatable)]
    return cases
