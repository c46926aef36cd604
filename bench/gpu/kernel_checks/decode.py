"""GPU checks of the decode kernels: the decode GEMM's in-kernel statistic and in-cluster
split-K sum, the decode residual epilogue and the decode attention input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bench.gpu.kernel_checks.common import (ALL_CHECKS, BF16, F32, INTERPRET, SMOKE, Case,
                                            assert_bitwise, calls_bitwise_equal, draw, sized)
from pallas_kernels import hardware
from verify import checks
from verify import residual as vr


def decode_gemm_statistic_cases() -> list[Case]:
    """The decode GEMM at split_k = 1 with no row scale given: the row statistic from the x
    tiles in the kernel (q/k/v of an 8B model, both warpgroup counts), verify's judge."""
    from pallas_kernels import decode_config as dc
    from pallas_kernels import decode_matmul as dm

    cases = []
    for m, (tile_n, warpgroups) in ((1, (128, 1)), (8, (64, 2)), (64, (128, 1))):
        m, k, n = sized((m, 4096, 4096), (m, 128, 256))
        config = dc.deepest(dc.DecodeConfig(tile_n=tile_n, warpgroups=warpgroups), 2)

        def correct(m=m, k=k, n=n, config=config):
            rng = np.random.default_rng(m + 1000)
            inputs = dict(x=draw(rng, (m, k), BF16),
                          kernel=[draw(rng, (k, width), BF16, 1 / np.sqrt(k))
                                  for width in (n, n // 4, n // 4)],
                          bias=[draw(rng, (n,), F32), None, None], eps=1e-6)
            outs = dm.lazy_rms_decode_matmul(
                jnp.asarray(inputs["x"]), [jnp.asarray(w) for w in inputs["kernel"]],
                eps=inputs["eps"], biases=[None if b is None else jnp.asarray(b)
                                           for b in inputs["bias"]],
                config=config, interpret=INTERPRET)
            return f"err/tol {checks.check_outputs('rms_norm_dense', outs, **inputs):.3f}"

        label = (f"decode GEMM statistic in kernel {m}x{k}x({n}+{n // 4}+{n // 4}) "
                 f"n{config.tile_n} wg{config.warpgroups}")
        cases.append(("correct", label, correct))
    return cases


# The decode GEMM with its K splits summed in a cluster (reduction="cluster": rank 0 reads its
# peers' partials through DSMEM on the GPU, through global scratch under the interpreter) at
# the 1B-class presets' o, down and q/k/v launches: (M, K, (N_i...)), split, tile_n, warpgroups.
# The last case walks 16 tiles of 128 columns with 15 resident clusters of 8 (a cluster
# reuses its buffers); a bench process died with a launch failure at that config, M = 8
# (bench/results/2026-12-05-decode-cold), so it runs after the others.
DECODE_CLUSTER_CASES = [((1, 2048, (1024,)), 8, 64, 1), ((8, 3072, (1024,)), 8, 64, 1),
                        ((8, 8192, (2048,)), 4, 128, 1), ((64, 2048, (2048, 512, 512)), 2, 64, 2),
                        ((8, 1024, (1152,)), 6, 64, 1), ((8, 8192, (2048,)), 6, 128, 1),
                        ((8, 2048, (2048,)), 3, 64, 1), ((8, 8192, (2048,)), 8, 128, 1)]


def decode_gemm_cluster_cases() -> list[Case]:
    """correct (verify's judge, biases on the first weight), NaN isolated (a NaN row of x
    stays in its row) and repeatable (bitwise, 20 calls) for the in-cluster split-K sum."""
    from pallas_kernels import decode_config as dc
    from pallas_kernels import decode_matmul as dm

    cases, seen = [], set()
    for (m, k, ns), split, tile_n, warpgroups in DECODE_CLUSTER_CASES:
        if SMOKE:  # small shapes: cases that shrink to the same one run once
            k, ns, split = 256, tuple(64 * (1 + i % 3) for i in range(len(ns))), 2
        if (m, k, ns, split, tile_n, warpgroups) in seen:
            continue
        seen.add((m, k, ns, split, tile_n, warpgroups))
        config = dc.deepest(dc.DecodeConfig(tile_n=tile_n, split_k=split, warpgroups=warpgroups,
                                            reduction="cluster"), 2)

        def inputs(m=m, k=k, ns=ns, seed=0):
            rng = np.random.default_rng(seed + m + k)
            return dict(x=draw(rng, (m, k), BF16, shift=0.3),
                        kernel=[draw(rng, (k, n), BF16, 1 / np.sqrt(k)) for n in ns],
                        bias=[draw(rng, (n,), F32) if i == 0 else None for i, n in enumerate(ns)],
                        eps=1e-6)

        def run(inp, config=config):
            x = jnp.asarray(inp["x"])
            return dm.lazy_rms_decode_matmul(
                x, [jnp.asarray(w) for w in inp["kernel"]], eps=inp["eps"],
                biases=[None if b is None else jnp.asarray(b) for b in inp["bias"]],
                config=config, interpret=INTERPRET)

        def correct(inputs=inputs, run=run):
            inp = inputs(seed=1)
            return f"err/tol {checks.check_outputs('rms_norm_dense', run(inp), **inp):.3f}"

        def nan_isolated(inputs=inputs, run=run, m=m):
            inp = inputs(seed=2)
            inp["x"] = inp["x"].copy()
            inp["x"][m // 2, 3] = np.nan
            outs = [np.asarray(y.astype(F32)) for y in run(inp)]
            rows = np.arange(m) != m // 2
            if not all(np.isnan(y[m // 2]).all() and np.isfinite(y[rows]).all() for y in outs):
                raise AssertionError("a NaN in one row of x reached another row")
            return "NaN row stays NaN, others finite"

        def repeatable(inputs=inputs, run=run):
            return calls_bitwise_equal(run, inputs(seed=3))

        label = (f"decode GEMM cluster sum {m}x{k}x({'+'.join(map(str, ns))}) "
                 f"n{config.tile_n} s{config.split_k} wg{config.warpgroups}")
        cases += [("correct", label, correct), ("NaN isolated", label, nan_isolated),
                  ("repeatable", label, repeatable)]
    return cases


# The decode residual epilogue (pallas_kernels/decode_matmul.decode_residual_matmul: h = x @ W
# + b + r and h's per-tile statistics in one launch) at the presets' o and down launches:
# (M, K, N), split (cluster when > 1), tile_n, warpgroups; rows of |mean|/std ~ 1e3.
DECODE_RESIDUAL_CASES = [((1, 2048, 1024), 8, 64, 1), ((8, 3072, 1024), 4, 64, 2),
                         ((8, 8192, 2048), 4, 128, 1), ((64, 1024, 1152), 1, 64, 1)]


def decode_residual_cases() -> list[Case]:
    """correct (h, mean and M2 by verify.residual's judge), NaN isolated and repeatable for
    the decode GEMM's residual epilogue."""
    from jaxnorm import row_stats
    from pallas_kernels import decode_config as dc
    from pallas_kernels import decode_matmul as dm

    cases = []
    for (m, k, n), split, tile_n, warpgroups in DECODE_RESIDUAL_CASES:
        if SMOKE:
            k, n, split = 256, 128 * warpgroups, min(split, 2)
        config = dc.DecodeConfig(tile_n=tile_n, split_k=split, warpgroups=warpgroups,
                                 stages=12, reduction="cluster" if split > 1 else "xla")

        def inputs(m=m, k=k, n=n, seed=0):
            rng = np.random.default_rng(seed + 7 * m + k)
            sign = np.where(rng.random((m, 1)) < 0.5, -1.0, 1.0)
            return dict(x=draw(rng, (m, k), BF16),
                        kernel=draw(rng, (k, n), BF16, 1 / np.sqrt(k)),
                        residual=np.asarray(jnp.asarray(
                            rng.standard_normal((m, n)) + 1e3 * sign, BF16)),
                        bias=draw(rng, (n,), F32))

        def run(inp, config=config, n=n):
            h, sums, m2s = dm.decode_residual_matmul(
                jnp.asarray(inp["x"]), jnp.asarray(inp["kernel"]), jnp.asarray(inp["residual"]),
                bias=jnp.asarray(inp["bias"]), config=config, interpret=INTERPRET)
            mean, m2 = row_stats.from_partials(sums, m2s, config.tile_n)
            return h, row_stats.RowStats(mean, m2, n)

        def correct(inputs=inputs, run=run):
            inp = inputs(seed=1)
            h, stats = run(inp)
            worst = max(checks._ratio(j) for j in vr.judge_residual(h, stats, "output", **inp))
            return f"err/tol {worst:.3f}"

        def nan_isolated(inputs=inputs, run=run, m=m):
            inp = inputs(seed=2)
            inp["x"] = inp["x"].copy()
            inp["x"][m // 2, 5] = np.nan
            h, stats = run(inp)
            h = np.asarray(h.astype(F32))
            rows = np.arange(m) != m // 2
            finite = all(np.isfinite(np.asarray(v)[rows]).all() for v in (h, stats.mean, stats.m2))
            if not (np.isnan(h[m // 2]).all() and np.isnan(np.asarray(stats.mean)[m // 2])
                    and finite):
                raise AssertionError("a NaN in one row of x reached another row")
            return "NaN row stays NaN, others finite"

        def repeatable(inputs=inputs, run=run):
            return calls_bitwise_equal(run, inputs(seed=3))

        label = (f"decode residual epilogue {m}x{k}x{n} n{tile_n} s{config.split_k} "
                 f"wg{warpgroups}")
        cases += [("correct", label, correct), ("NaN isolated", label, nan_isolated),
                  ("repeatable", label, repeatable)]
    return cases


# The decode attention-input kernel (pallas_kernels/decode_attention_input.py) at the
# presets of bench/decode_attention_bench.py, the QK-norm ones and Llama-3-8B's without
# (smoke: d_model 128, 2 q heads and 1 kv head of the preset's head_dim).
DECODE_ATTENTION_ROWS = (1, 8, 64)


def decode_attention_input_cases() -> list[Case]:
    """correct (every preset and M; gain folded, and unfolded at M = 8; and with each head's
    K split in a cluster at head_dim 128), NaN isolated and repeatable (M = 8) for the decode
    attention-input kernel, judged by verify.rope."""
    from bench import decode_attention_bench as dab

    cases = []
    for i, preset in enumerate(dab.PRESETS):
        d, n_q, n_kv = sized((preset.d_model, preset.n_heads, preset.n_kv_heads), (128, 2, 1))
        p = preset._replace(d_model=d, n_heads=n_q, n_kv_heads=n_kv)
        for m in DECODE_ATTENTION_ROWS:
            forms = ["folded", "unfolded"] if m == 8 else ["folded"]
            split = dab.cluster_config(m, p, sms=hardware.num_sms(), interpret=INTERPRET)
            if split is not None and m in (1, 8):
                forms.append("cluster")
            for form in forms:
                unfolded = form == "unfolded"
                config = split if form == "cluster" else None
                label = (f"decode attention input {p.name} {m}x{p.d_model} "
                         f"{p.n_heads}/{p.n_kv_heads}x{p.head_dim} "
                         + {"folded": "gain folded", "unfolded": "gain unfolded",
                            "cluster": f"gain folded, K split {config.split_k if config else 0} "
                                       "in a cluster"}[form])
                variant = {"folded": dab.KERNEL, "unfolded": dab.UNFOLDED,
                           "cluster": dab.CLUSTER}[form]

                def run(a, p=p, unfolded=unfolded, config=config):
                    return dab.kernel(a, p, unfolded=unfolded, config=config,
                                      interpret=INTERPRET)

                def judge(a, p=p, run=run, variant=variant):
                    return f"err/tol {dab.judge(variant, run(a), a, p)['err_tol']:.3f}"

                def draw(seed, m=m, p=p):
                    return dab.inputs(jax.random.key(seed), m, p)

                def correct(draw=draw, judge=judge, seed=1000 + 10 * i + m):
                    return judge(draw(seed))

                def nan_isolated(draw=draw, judge=judge, seed=1100 + i):
                    a = draw(seed)
                    m_, k = a.x.shape
                    return judge(a._replace(x=a.x.at[m_ // 2, k // 3].set(jnp.nan)))

                def repeatable(draw=draw, run=run, seed=1200 + i):
                    a = draw(seed)
                    assert_bitwise(run(a), run(a), "second call")
                    return "bitwise"

                fns = {"correct": correct, "NaN isolated": nan_isolated,
                       "repeatable": repeatable}
                checks_here = ALL_CHECKS if m == 8 and not unfolded else ("correct",)
                cases += [(check, label, fns[check]) for check in checks_here]
    return cases
