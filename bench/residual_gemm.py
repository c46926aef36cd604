"""The residual-gemm suite: the GEMM that writes the residual stream and its statistics,
and the pre-norm GEMM that takes them (issue 17; `python -m bench --suite residual-gemm`).

Two ops, at M = 8192 for the (K, N) of `KNS` (o- and down-projections of the presets):
- "residual_gemm": h = x @ W + r. jaxnorm: `residual_dense` (impl="mosaic"), h and its
  rows' (mean, M2); xla: `x @ w + r` in bf16 (XLA fuses the add into cuBLAS as beta = 1),
  no statistics; plain-gemm: our GEMM core without the residual (a floor, not a rival).
- "given_stats": RMSNorm(h) @ W with h's statistics given. jaxnorm: `rms_norm_dense(...,
  statistics=)` (impl="mosaic"), a row scale in the epilogue; xla-dot: XLA's `x @ w` alone
  (the floor); xla: the stock norm, then the dot.
Every implementation of a case is timed back to back on the same rotating inputs
(CUPTI kernel time and wall time, `bench.timing`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from bench import ledger
from bench.cases import Case, Spec
from bench.impls import EPS, REGISTRY, Fn, register, stock_rms_norm

M = 8192
KNS = ((4096, 4096), (14336, 4096), (2048, 2048), (8192, 2048), (2048, 3072))
KNS_QUICK = KNS[:2]
RESIDUAL, GIVEN = "residual_gemm", "given_stats"
# The jaxnorm rows' implementation (tests/test_residual_bench.py runs the builders under the
# interpreter on a CPU).
KERNEL_IMPL = "mosaic"
REGISTRY.setdefault(RESIDUAL, {})
REGISTRY.setdefault(GIVEN, {})


class ResidualCase(Case):
    """A Case whose inputs are (x, w, r) (residual_gemm) or (h, scale, w, mean, m2)."""

    def specs(self) -> list[Spec]:
        (n,) = self.ns
        x, w = ((self.m, self.k), 0.0, 1.0), ((self.k, n), 0.0, self.k**-0.5)
        if self.op == RESIDUAL:
            return [x, w, ((self.m, n), 0.0, 1.0)]
        return [x, ((self.k,), 1.0, 0.1), w]

    def inputs(self, seed: int, dtype: jnp.dtype = jnp.bfloat16) -> tuple[jax.Array, ...]:
        arrays = super().inputs(seed, dtype)
        if self.op == RESIDUAL:
            return arrays
        h32 = arrays[0].astype(jnp.float32)  # the statistics a residual GEMM would hand over
        mean = jnp.mean(h32, axis=-1)
        return (*arrays, mean, jnp.sum(jnp.square(h32 - mean[:, None]), axis=-1))

    def ledger_ops(self, *, fused: bool, gemm_only: bool = False) -> list[ledger.Op]:
        (n,) = self.ns
        gemm = ledger.gemm_ops(self.m, self.k, self.ns)
        if gemm_only:
            return gemm
        if self.op == RESIDUAL:  # the epilogue reads r: the add rides the GEMM
            return gemm + [ledger.Op("residual", ledger.ELEMENTWISE,
                                     ledger.residual_add(self.m, n), host="gemm0")]
        if fused:  # the row scale rides the epilogue: the GEMM's traffic alone
            return gemm
        return ledger.norm_gemm_ops(self.m, self.k, self.ns, fused=False)


def cases(quick: bool) -> list[Case]:
    kns = KNS_QUICK if quick else KNS
    return [ResidualCase(op, M, k, (n,), label=op.replace("_", "-"))
            for op in (RESIDUAL, GIVEN) for k, n in kns]


@register(RESIDUAL, "jaxnorm")
def _jaxnorm_residual(case: Case) -> Fn:
    import jaxnorm

    def fn(x: jax.Array, w: jax.Array, r: jax.Array) -> Any:
        return jaxnorm.residual_dense(x, w, r, impl=KERNEL_IMPL)

    return fn


@register(RESIDUAL, "xla")
def _xla_residual(case: Case) -> Fn:
    return lambda x, w, r: x @ w + r


@register(RESIDUAL, "plain-gemm", gemm_only=True)
def _plain_residual(case: Case) -> Fn:
    from pallas_kernels.plain_matmul import plain_matmul

    return lambda x, w, r: plain_matmul(x, w)


@register(GIVEN, "jaxnorm")
def _jaxnorm_given(case: Case) -> Fn:
    import jaxnorm

    def fn(h: jax.Array, scale: jax.Array, w: jax.Array, mean: jax.Array,
           m2: jax.Array) -> jax.Array:
        stats = jaxnorm.RowStats(mean, m2, case.k)
        return jaxnorm.rms_norm_dense(h, scale, w, statistics=stats, eps=EPS, impl=KERNEL_IMPL)

    return fn


@register(GIVEN, "jaxnorm-gain-in-mainloop")
def _gain_in_mainloop_given(case: Case) -> Fn:
    """The given-statistics GEMM with the unfolded gain applied to each x tile in the
    mainloop (`lazy_rms_matmul(gain_in_kernel=True)`) instead of an XLA pass over x."""
    import dataclasses

    from jaxnorm import row_stats
    from pallas_kernels import lazy_norm_matmul as lz

    config = dataclasses.replace(lz.default_config(case.m, case.k, list(case.ns)),
                                 cluster_dimension=None, wgmma_in_flight=0)

    def fn(h: jax.Array, scale: jax.Array, w: jax.Array, mean: jax.Array,
           m2: jax.Array) -> jax.Array:
        row_scale = row_stats.rms_inverse(row_stats.RowStats(mean, m2, case.k), EPS)
        (y,) = lz.lazy_rms_matmul(h, [w], scale=scale, row_scale=row_scale, gain_in_kernel=True,
                                  config=config, interpret=KERNEL_IMPL == "interpret")
        return y

    return fn


@register(GIVEN, "xla-dot", gemm_only=True)
def _xla_dot_given(case: Case) -> Fn:
    return lambda h, scale, w, mean, m2: h @ w


@register(GIVEN, "xla")
def _xla_given(case: Case) -> Fn:
    return lambda h, scale, w, mean, m2: stock_rms_norm(h, scale) @ w
