"""What one more launch costs a jitted program's wall time, by kind of launch.

A model step's wall time exceeds its kernel time by what the GPU waits for the host
(bench/results: 1-3 ms in Gemma-3-1B's prefill and training). Whether a fused kernel
pays depends on that per-launch cost, not only on its kernel time, so this measures it:
one program per (kind, n) runs n dependent launches of one tiny op, all kinds' programs
timed in turn, sample by sample (interleaved), wall time and CUPTI kernel time; the
per-launch host cost is the slope of wall time over n, and each launch's kernel count
is checked from CUPTI (a kind whose launches XLA merged is reported as such).

Kinds: `fusion` (an XLA elementwise fusion, kept apart by optimization barriers),
`cublas` (XLA's bf16 dot), `mosaic_plain` (our plain GEMM), `mosaic_lazy` (the lazy
pre-norm GEMM with its row scale given: one more TMA descriptor and epilogue vector).
Usage: python bench/gpu/launch_cost_probe.py --launches 1,8,32 --out launch-cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import jax
import jax.numpy as jnp

from bench import timing
from pallas_kernels import lazy_norm_matmul, plain_matmul

KINDS = ("fusion", "cublas", "mosaic_plain", "mosaic_lazy")


def _op(kind: str, w: jax.Array, r: jax.Array, interpret: bool) -> Callable[[jax.Array], jax.Array]:
    """One launch of `kind` on x [M, D] -> [M, D] (D = w's size), x's dtype."""
    if kind == "fusion":
        return lambda x: (x.astype(jnp.float32) * 0.5 + 1.0).astype(x.dtype)
    if kind == "cublas":
        return lambda x: x @ w
    if kind == "mosaic_plain":
        return lambda x: plain_matmul.plain_matmul(x, w, interpret=interpret)
    if kind == "mosaic_lazy":
        return lambda x: lazy_norm_matmul.lazy_rms_matmul(x, [w], row_scale=r,
                                                          interpret=interpret)[0]
    raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")


def chain(kind: str, n: int, w: jax.Array, r: jax.Array, *,
          interpret: bool = False) -> Callable[[jax.Array], jax.Array]:
    """x -> n dependent launches of `kind`, an optimization barrier between each (so XLA
    neither fuses nor reorders them)."""
    op = _op(kind, w, r, interpret)

    def fn(x: jax.Array) -> jax.Array:
        for _ in range(n):
            x = jax.lax.optimization_barrier(op(x))
        return x

    return fn


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of (n, us) points: microseconds per added launch."""
    mean_n = statistics.fmean(n for n, _ in points)
    mean_t = statistics.fmean(t for _, t in points)
    den = sum((n - mean_n) ** 2 for n, _ in points)
    return sum((n - mean_n) * (t - mean_t) for n, t in points) / den if den else 0.0


def run(kinds: tuple[str, ...], launches: tuple[int, ...], *, rows: int = 128, dim: int = 256,
        repeats: int = 50, interpret: bool = False) -> dict:
    """Wall (interleaved medians) and CUPTI time of every (kind, n) program, and per kind the
    slope of each over n."""
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (rows, dim), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (dim, dim), jnp.float32) / dim ** 0.5).astype(jnp.bfloat16)
    r = jax.random.uniform(keys[2], (rows,), jnp.float32, 0.5, 1.5)
    programs = {(k, n): chain(k, n, w, r, interpret=interpret) for k in kinds for n in launches}
    # One sample of every program per pass: drift falls on all alike.
    walls = timing.interleaved_wall({f"{k}:{n}": (fn, [(x,)]) for (k, n), fn in programs.items()},
                                    repeats=repeats)
    cells = []
    for (kind, n), fn in programs.items():
        wall = walls[f"{kind}:{n}"]
        t = timing.measure(fn, [(x,)], repeats=min(repeats, 20), wall=wall)
        cells.append({"kind": kind, "launches": n, "wall_us": t.wall_us,
                      "wall_min_us": min(wall.samples_us), "kernel_us": t.kernel_us,
                      "kernels": len(t.kernels), "kernel_names": sorted({k for k, _ in t.kernels}),
                      "cupti_error": t.cupti_error})
    per_kind = {}
    for kind in kinds:
        mine = [c for c in cells if c["kind"] == kind]
        per_kind[kind] = {
            "wall_us_per_launch": slope([(c["launches"], c["wall_us"]) for c in mine]),
            "kernel_us_per_launch": (slope([(c["launches"], c["kernel_us"]) for c in mine])
                                     if all(c["kernel_us"] is not None for c in mine) else None),
            "kernels_per_launch": (slope([(c["launches"], c["kernels"]) for c in mine])
                                   if all(c["cupti_error"] is None for c in mine) else None),
        }
    return {"device": str(jax.devices()[0]), "rows": rows, "dim": dim, "repeats": repeats,
            "cells": cells, "per_kind": per_kind}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--launches", default="1,8,32")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--interpret", action="store_true",
                        help="the Pallas interpreter (CPU; timings mean nothing)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    for kind in kinds:
        if kind not in KINDS:
            parser.error(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    result = run(kinds, tuple(map(int, args.launches.split(","))), rows=args.rows,
                 dim=args.dim, repeats=args.repeats, interpret=args.interpret)
    for kind, s in result["per_kind"].items():
        print(f"{kind:13s} wall {s['wall_us_per_launch']:7.2f} us/launch, kernel "
              f"{s['kernel_us_per_launch']}, kernels/launch {s['kernels_per_launch']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
