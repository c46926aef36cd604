"""One benchmark case: the op, its shape, its random inputs and its ledger.

The op names the work every implementation of a row computes:
- "norm_gemm": Norm(x) @ W for one or more weights sharing the norm (pre-norm);
- "gemm_norm": RMSNorm(x @ W + b) (post-norm);
- "gemm_norm_add": r + RMSNorm(x @ W + b) (post-norm, the residual added after: Gemma 2/3,
  OLMo 2);
- "norm": a standalone norm;
- "train": forward and backward (pullback of a random cotangent) of norm_gemm.
Inputs: x ~ N(0, 1), weights ~ N(0, 1/K), gains 1 + 0.1 N(0, 1), biases
0.1 N(0, 1): random, never zeros, so no kernel can shortcut on the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from bench import ledger

Spec = tuple[tuple[int, ...], float, float]  # shape, mean, standard deviation


@dataclass(frozen=True)
class Case:
    """One shape of one op; every implementation of the op is timed on it."""

    op: str
    m: int
    k: int
    ns: tuple[int, ...] = ()
    norm: str = "rms"
    label: str = ""
    """Where the shape comes from, e.g. "llama3-8b qkv"."""

    @property
    def kn(self) -> str:
        """The --kn filter key: "KxN" with N the total output width, or "K" for norms."""
        return f"{self.k}x{sum(self.ns)}" if self.ns else str(self.k)

    @property
    def shape(self) -> str:
        widths = "+".join(str(n) for n in self.ns)
        return f"{self.m}x{self.k}" + (f"x{widths}" if widths else "")

    def specs(self) -> list[Spec]:
        """Input shapes in the order implementations take them."""
        m, k = self.m, self.k
        x = ((m, k), 0.0, 1.0)
        weights = [((k, n), 0.0, k**-0.5) for n in self.ns]
        if self.op in ("gemm_norm", "gemm_norm_add"):
            (n,) = self.ns
            residual = [((m, n), 0.0, 1.0)] if self.op == "gemm_norm_add" else []
            return [x, weights[0], ((n,), 0.0, 0.1), ((n,), 1.0, 0.1), *residual]
        vectors = [((k,), 1.0, 0.1)] + ([((k,), 0.0, 0.1)] if self.norm == "layer" else [])
        if self.op == "norm":
            return [x, *vectors]
        cotangents = [((m, n), 0.0, 1.0) for n in self.ns] if self.op == "train" else []
        return [x, *vectors, *weights, *cotangents]

    def inputs(self, seed: int, dtype: jnp.dtype = jnp.bfloat16) -> tuple[jax.Array, ...]:
        """One full set of inputs on the default device."""
        keys = jax.random.split(jax.random.key(seed), len(self.specs()))
        return tuple(
            (mean + std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
            for key, (shape, mean, std) in zip(keys, self.specs(), strict=True)
        )

    def set_bytes(self, bytes_per_number: int = ledger.BF16_BYTES) -> int:
        return sum(math.prod(shape) for shape, _, _ in self.specs()) * bytes_per_number

    def ledger_ops(self, *, fused: bool, gemm_only: bool = False) -> list[ledger.Op]:
        """The ledger of this case's work; `gemm_only` for implementations that skip the norm."""
        m, k, ns = self.m, self.k, self.ns
        if self.op == "norm":
            return ledger.norm_ops(m, k, norm=self.norm)
        if self.op == "train":
            if gemm_only:
                n = sum(ns)
                return ledger.gemm_ops(m, k, ns) + [
                    ledger.Op("dx_gemm", ledger.GEMM, ledger.matmul(m, n, k)),
                    ledger.Op("dw_gemm", ledger.GEMM, ledger.matmul(k, m, n)),
                ]
            return ledger.train_norm_gemm_ops(m, k, ns, fused=fused)
        if gemm_only:
            return ledger.gemm_ops(m, k, ns)
        if self.op == "gemm_norm":
            return ledger.gemm_norm_ops(m, k, ns[0], fused=fused)
        if self.op == "gemm_norm_add":
            return ledger.gemm_norm_add_ops(m, k, ns[0], fused=fused)
        return ledger.norm_gemm_ops(m, k, ns, norm=self.norm, fused=fused)
