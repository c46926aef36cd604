"""Measure the two roofline ceilings in the same process as the rows they judge.

Ratios against a ceiling measured on another day mislead (clocks, drivers and
XLA versions move), so every GPU run measures its own: HBM bandwidth as a
large device-to-device elementwise copy (bytes read + written) and the bf16
GEMM rate as XLA's 8192^3 product.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from bench import ledger, timing

COPY_ELEMENTS = 2**28  # 512 MiB of bf16 per copy, far beyond the 60 MB L2
GEMM_SIZE = 8192


def measure_ceilings(repeats: int) -> tuple[ledger.Ceilings, dict[str, Any]]:
    """(ceilings for the roofline, the raw timings behind them)."""
    copies = [
        (jax.random.normal(jax.random.key(i), (COPY_ELEMENTS,), jnp.bfloat16),) for i in range(2)
    ]
    copy = timing.measure(lambda a: -a, copies, repeats=repeats)
    copy_bytes = 2 * COPY_ELEMENTS * ledger.BF16_BYTES
    del copies

    n = GEMM_SIZE
    keys = jax.random.split(jax.random.key(10), 4)
    operands = [
        tuple(jax.random.normal(keys[2 * i + j], (n, n), jnp.bfloat16) for j in range(2))
        for i in range(2)
    ]
    gemm = timing.measure(lambda a, b: a @ b, operands, repeats=repeats)
    gemm_flops = ledger.matmul(n, n, n).flops
    del operands

    ceilings = ledger.Ceilings(
        hbm_bytes_per_s=copy_bytes / (copy.best_us * 1e-6),
        gemm_flops_per_s=gemm_flops / (gemm.best_us * 1e-6),
        source="measured in this run: -x over 512 MiB bf16 (read + write), XLA bf16 8192^3 dot",
    )
    raw = {
        "copy": {"bytes": copy_bytes, **dataclasses.asdict(copy)},
        "gemm": {"flops": gemm_flops, **dataclasses.asdict(gemm)},
    }
    return ceilings, raw
