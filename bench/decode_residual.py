"""The residual stream at decode: h = x @ W + r and the next norm's statistic, against stock.

    PYTHONPATH=. python -m bench.decode_residual --out $OUT [--rows 1,8,64]   # H200
    PYTHONPATH=. python -m bench.decode_residual --smoke --out /tmp/r           # CPU

Per o- or down-projection launch of the presets (M x K x N, M <= 64), three ways, timed
interleaved on the same rotating inputs (`bench.timing`: CUPTI kernel time summed over
every kernel of the call, copies over 3x L2):
- stock: `x @ w + r` in bf16 and the next RMSNorm's statistic mean(h^2), as stock Flax's
  residual add and norm compute it;
- two launches: the decode GEMM with the table's config (pallas_kernels/decode_configs.py;
  split-K partials summed by XLA), then XLA's residual add and h's statistics (what
  `residual_dense` runs at decode with split-K partials);
- one launch: the same tiles with the K splits summed in a cluster (at most 8), the
  residual added and h's per-tile (sum, M2) written by the kernel
  (`decode_matmul.decode_residual_matmul`), combined by XLA.
Each kernel's h and statistics are judged against float64 (verify.residual) first; a
wrong one is reported, never timed. decode-residual.json is rewritten after every launch.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bench import report, timing
from jaxnorm import RowStats, row_stats
from jaxnorm.backends import xla
from pallas_kernels import decode_config as dc
from pallas_kernels import decode_matmul as dm
from pallas_kernels import hardware
from verify import residual as vr
from verify.checks import Judged, _ratio

BF16 = jnp.bfloat16
# (K, N) of the o- and down-projections: Llama-3.2-1B, Qwen3-0.6B, Qwen3-4B, Llama-3-8B.
LAUNCHES = [(2048, 2048), (8192, 2048), (2048, 1024), (3072, 1024), (4096, 2560),
            (9728, 2560), (4096, 4096), (14336, 4096)]
ROWS = (1, 8, 64)
SMOKE_LAUNCHES, SMOKE_ROWS = [(256, 128)], (8,)
ROUNDS = 2
Variant = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def configs(m: int, k: int, n: int, sms: int, interpret: bool) -> tuple[dc.DecodeConfig, ...]:
    """(two launches' config, one launch's): the table's (or the model's) pick, and its
    tiles with the K splits summed in a cluster as wide as keeps every tile's cluster
    resident (`decode_config.one_wave_cluster_split`; unsplit where none does), the stages
    refitted to the residual tiles. Under the interpreter two splits, so that the smoke run
    takes both reductions."""
    if interpret:
        two = dc.DecodeConfig(tile_n=64, split_k=2, stages=3)
        return two, dataclasses.replace(two, reduction="cluster")
    two = dm.decode_config(m, k, [n], sms=sms)
    one = two if n % two.cta_tile_n == 0 else dataclasses.replace(two, tile_n=64, warpgroups=1)
    split = dc.one_wave_cluster_split(n // one.cta_tile_n, k // one.tile_k, sms) or 1
    return two, dataclasses.replace(one, split_k=split,
                                    reduction="cluster" if split > 1 else "xla")


def variants(two: dc.DecodeConfig, one: dc.DecodeConfig, interpret: bool) -> dict[str, Variant]:
    """label -> fn(x, w, r) = (h, the statistic the next RMSNorm needs, mean(h^2))."""

    def stock(x, w, r):
        h = x @ w + r
        return h, jnp.mean(jnp.square(h.astype(jnp.float32)), axis=-1)

    def two_launches(x, w, r):
        (y,) = dm.lazy_rms_decode_matmul(x, [w], row_scale=jnp.ones((x.shape[0],), jnp.float32),
                                         config=two, interpret=interpret)
        h, mean, m2 = xla.residual_outputs(y, r)
        return h, _mean_square(mean, m2, w.shape[1])

    def one_launch(x, w, r):
        h, sums, m2s = dm.decode_residual_matmul(x, w, r, config=one, interpret=interpret)
        mean, m2 = row_stats.from_partials(sums, m2s, one.tile_n)
        return h, _mean_square(mean, m2, w.shape[1])

    return {"stock": stock, "two launches": two_launches, "one launch": one_launch}


def _mean_square(mean: jax.Array, m2: jax.Array, n: int) -> jax.Array:
    return m2 / n + mean * mean


def _inputs(key: jax.Array, m: int, k: int, n: int) -> tuple[jax.Array, ...]:
    kx, kw, kr = jax.random.split(key, 3)
    return (jax.random.normal(kx, (m, k), BF16),
            (jax.random.normal(kw, (k, n), jnp.float32) / k**0.5).astype(BF16),
            jax.random.normal(kr, (m, n), BF16))


def worst_error(fn: Variant, x: jax.Array, w: jax.Array, r: jax.Array) -> float:
    """Worst error/tolerance: h by verify.residual's judge, and mean(h^2) against the float64
    one of the h returned, within what float32 statistics of h may be off by
    (ms = M2 / N + mean^2, from `verify.residual.statistics_tolerance`)."""
    h, mean_square = fn(x, w, r)
    h64 = np.asarray(h.astype(jnp.float32), np.float64)
    mean64, m2_64 = vr.row_statistics(h64)
    n = h64.shape[-1]
    judged = vr.judge_residual(h, RowStats(jnp.asarray(mean64, jnp.float32),
                                           jnp.asarray(m2_64, jnp.float32), n),
                               "output", x=x, kernel=w, residual=r, bias=None)
    t_mean, t_m2 = vr.statistics_tolerance(h64, np.zeros_like(h64))
    judged.append(Judged("mean(h^2)", np.asarray(mean_square), m2_64 / n + mean64**2,
                         t_m2 / n + 2 * np.abs(mean64) * t_mean + t_mean**2))
    return max(_ratio(j) for j in judged)


def measure(m: int, k: int, n: int, *, sms: int, interpret: bool,
            repeats: int) -> dict[str, Any]:
    key = jax.random.key(m * 131 + k * 7 + n)
    first = _inputs(key, m, k, n)
    copies = 1 if interpret else timing.rotation_copies(sum(a.nbytes for a in first))
    arg_sets = [first] + [_inputs(jax.random.fold_in(key, c), m, k, n) for c in range(1, copies)]
    two, one = configs(m, k, n, sms, interpret)
    row: dict[str, Any] = dict(launch=f"{m}x{k}x{n}", two=dataclasses.asdict(two),
                               one=dataclasses.asdict(one), variants={})
    fns = {}
    for label, fn in variants(two, one, interpret).items():
        entry = row["variants"].setdefault(label, {})
        try:
            entry["error"] = worst_error(fn, *first)
            fns[label] = fn
        except AssertionError as err:  # the judge's verdict, with the worst element
            if label == "stock":  # the baseline users run (at M = 1 XLA rounds x @ w, then + r):
                entry["outside_bound"] = str(err)[:300]  # reported, and still timed
                fns[label] = fn
            else:
                entry["failure"] = f"wrong against float64: {str(err)[:300]}"
        except Exception as err:  # a config that does not build is reported, not timed
            entry["failure"] = f"{type(err).__name__}: {str(err)[:300]}"
    for _ in range(ROUNDS):
        for label, fn in fns.items():
            t = timing.measure(fn, arg_sets, repeats=repeats, warmup=1)
            row["variants"][label].setdefault("rounds_us", []).append(t.best_us)
            row["variants"][label].setdefault("kernels", t.kernels)
    stock_us = min(row["variants"]["stock"].get("rounds_us", [float("nan")]))
    for entry in row["variants"].values():
        if "rounds_us" in entry:
            entry["us"] = min(entry["rounds_us"])
            entry["ratio"] = entry["us"] / stock_us
    return row


def table(rows: list[dict[str, Any]]) -> report.TextTable:
    lines = []
    for row in rows:
        v = row["variants"]
        lines.append([row["launch"], report.fmt(v["stock"].get("us")),
                      report.fmt(v["two launches"].get("us")),
                      report.fmt(v["two launches"].get("ratio"), 3),
                      report.fmt(v["one launch"].get("us")),
                      report.fmt(v["one launch"].get("ratio"), 3),
                      v["one launch"].get("failure", "")])
    return report.TextTable("residual stream at decode (kernel us; ratio to stock)",
                            ["M x K x N", "stock", "two launches", "/stock", "one launch",
                             "/stock", "not timed"], lines, left_columns=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--budget-s", type=float, default=200.0)
    parser.add_argument("--rows", type=lambda s: tuple(int(v) for v in s.split(",")),
                        default=ROWS, help="M values, e.g. 1,8 (default: 1,8,64)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny launch under the Pallas interpreter (CPU)")
    args = parser.parse_args(argv)
    if any(not 1 <= m <= dc.MAX_ROWS for m in args.rows):
        parser.error(f"--rows must lie in [1, {dc.MAX_ROWS}]; got {args.rows}")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    sms = hardware.INTERPRET_GRID_CTAS if args.smoke else hardware.num_sms()
    launches = [(m, k, n) for k, n in (SMOKE_LAUNCHES if args.smoke else LAUNCHES)
                for m in (SMOKE_ROWS if args.smoke else args.rows)]
    payload: dict[str, Any] = dict(environment=report.environment(), smoke=args.smoke,
                                   rows=[], skipped=[])
    for m, k, n in launches:
        if time.monotonic() - start > args.budget_s:
            payload["skipped"].append(f"{m}x{k}x{n}")
            continue
        row = measure(m, k, n, sms=sms, interpret=args.smoke, repeats=1 if args.smoke else 10)
        payload["rows"].append(row)
        payload["elapsed_s"] = time.monotonic() - start
        report.write_json(args.out / "decode-residual.json", payload)
        print(f"{row['launch']}: " + ", ".join(
            f"{label} {e.get('ratio', e.get('failure'))}" for label, e in row["variants"].items()),
            flush=True)
    skipped = ", ".join(payload["skipped"]) or "none"
    preamble = [f"`PYTHONPATH=. python -m bench.decode_residual --rows "
                f"{','.join(map(str, args.rows))}` ({time.monotonic() - start:.0f} s; skipped "
                f"for the budget: {skipped})."]
    report.write_markdown(args.out / "decode-residual.md", "Residual stream at decode",
                          preamble, [table(payload["rows"])])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
