"""The configs of a fused pre-norm GEMM at one model's shapes: every CTA tile, grid order and
the deepest pipeline that fits, CUPTI, interleaved with what XLA runs instead, each output
checked against XLA's first. `--kind gated`: the gate/up kernel against XLA's two dots and
activation-multiply; `--kind lazy`: the multi-weight lazy GEMM (q/k/v) against XLA's scaled
x and one dot per weight; the row scale given either way. Usage:
python bench/gpu/fused_config_probe.py --rows 4096,2048 --k 1152 --n 6912 --activation gelu_tanh
python bench/gpu/fused_config_probe.py --kind lazy --rows 4096,2048 --k 1152 --n 1024,256,256
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp

from bench import gemm_candidates, timing
from pallas_kernels import gated_matmul, gemm_config, lazy_norm_matmul
from pallas_kernels.gemm_config import MatmulDimension, TuningConfig

# (tile_m, tile_n, wg_dimension): each warpgroup holds two tile_m x tile_n accumulators.
TILES = ((64, 128, MatmulDimension.M), (64, 64, MatmulDimension.M), (64, 64, MatmulDimension.N),
         (128, 64, MatmulDimension.N), (128, 64, MatmulDimension.M), (64, 128, MatmulDimension.N))


def candidates(m: int, k: int, n: int) -> list[TuningConfig]:
    """The table-derived pick first, then its schedule (grid order and width, one wgmma step
    in flight), then each tile x grid order (grid tile width 8), the deepest pipeline
    (<= 6 slots) that fits."""
    pick = gated_matmul.gated_config(m, k, n)
    out = [pick]
    for in_flight in (0, 1):
        for minor in (MatmulDimension.M, MatmulDimension.N):
            for width in (4, 8, 16):
                fitted = gated_matmul.deepest_pipeline(dataclasses.replace(
                    pick, grid_minor_dim=minor, grid_tile_width=width,
                    wgmma_in_flight=in_flight), 2, max_steps=6)
                if fitted is not None and fitted not in out:
                    out.append(fitted)
    for tile_m, tile_n, wg in TILES:
        for minor in (MatmulDimension.M, MatmulDimension.N):
            fitted = gated_matmul.deepest_pipeline(
                TuningConfig(tile_m=tile_m, tile_n=tile_n, wg_dimension=wg, epi_tile_m=64,
                             epi_tile_n=min(64, tile_n), grid_minor_dim=minor,
                             grid_tile_width=8), 2, max_steps=6)
            if fitted is not None and fitted not in out:
                out.append(fitted)
    return out


# (tile_m, tile_n, wg_dimension) of the lazy GEMM's candidates.
LAZY_TILES = ((64, 256, MatmulDimension.M), (128, 128, MatmulDimension.N),
              (128, 128, MatmulDimension.M), (64, 128, MatmulDimension.M),
              (128, 64, MatmulDimension.N), (64, 64, MatmulDimension.M),
              (64, 64, MatmulDimension.N))


def lazy_candidates(m: int, k: int, ns: tuple[int, ...]) -> list[TuningConfig]:
    out = [gemm_config.default_config(m, k, ns)]
    for tile_m, tile_n, wg in LAZY_TILES:
        for minor in (MatmulDimension.M, MatmulDimension.N):
            fitted = gemm_candidates.deepest(TuningConfig(
                tile_m=tile_m, tile_n=tile_n, wg_dimension=wg, epi_tile_m=64,
                epi_tile_n=64, grid_minor_dim=minor, grid_tile_width=8))
            if fitted is not None and fitted not in out:
                out.append(fitted)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="gated", choices=("gated", "lazy"))
    parser.add_argument("--rows", default="4096,2048")
    parser.add_argument("--k", type=int, default=1152)
    parser.add_argument("--n", default="6912", help="N, or the lazy GEMM's N_i comma-separated")
    parser.add_argument("--activation", default="gelu_tanh")
    parser.add_argument("--budget-s", type=float, default=200)
    parser.add_argument("--max-configs", type=int, default=None, help="the first N candidates")
    parser.add_argument("--interpret", action="store_true",
                        help="the Pallas interpreter (CPU; timings mean nothing)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    act = gated_matmul.ACTIVATIONS[args.activation]
    ns = tuple(map(int, args.n.split(",")))
    start, rows = time.monotonic(), []
    for m in map(int, args.rows.split(",")):
        keys = jax.random.split(jax.random.key(m), 2 + len(ns) + (args.kind == "gated"))
        x = jax.random.normal(keys[0], (m, args.k), jnp.bfloat16)
        r = jax.random.uniform(keys[1], (m,), jnp.float32, 0.5, 2.0)
        ws = [jax.random.normal(kk, (args.k, n), jnp.bfloat16) / args.k ** 0.5
              for kk, n in zip(keys[2:], ns * (2 if args.kind == "gated" else 1))]
        if args.kind == "gated":
            xla = jax.jit(lambda x, r, wg, wu: (act((x @ wg).astype(jnp.float32) * r[:, None])
                                                * ((x @ wu).astype(jnp.float32) * r[:, None])
                                                ).astype(x.dtype))
            configs = candidates(m, args.k, ns[0])
            kernel = lambda c: lambda x, r, wg, wu: gated_matmul.gated_rms_matmul(
                x, wg, wu, activation=args.activation, row_scale=r, config=c,
                interpret=args.interpret)
        else:
            xla = jax.jit(lambda x, r, *ws: jnp.concatenate(
                [(x * r[:, None]).astype(x.dtype) @ w for w in ws], axis=1))
            configs = lazy_candidates(m, args.k, ns)
            kernel = lambda c: lambda x, r, *ws: jnp.concatenate(
                lazy_norm_matmul.lazy_rms_matmul(x, ws, row_scale=r, config=c,
                                                 interpret=args.interpret), axis=1)
        inputs = (x, r, *ws)
        want = xla(*inputs).astype(jnp.float32)
        for config in configs[:args.max_configs]:
            if time.monotonic() - start > args.budget_s:
                break
            fn = jax.jit(kernel(config))
            row = {"kind": args.kind, "m": m, "k": args.k, "n": args.n,
                   "config": gemm_candidates.name(config)}
            try:
                got = fn(*inputs).astype(jnp.float32)
            except Exception as e:  # Unsupported, or a config Mosaic does not compile
                rows.append({**row, "status": f"{type(e).__name__}: {str(e)[:120]}"})
                continue
            err = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
            ours = timing.measure(fn, [inputs], repeats=10, warmup=3).best_us
            xla_us = timing.measure(xla, [inputs], repeats=10, warmup=3).best_us
            rows.append({**row, "status": "ok" if err < 2e-2 else "wrong", "rel_err": err,
                         "us": round(ours, 2), "xla_us": round(xla_us, 2),
                         "ratio": round(ours / xla_us, 4)})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": str(jax.devices()[0]), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
