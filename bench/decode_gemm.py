"""The decode GEMM (pallas_kernels/decode_matmul.py) against cuBLAS at the presets' decode shapes.

    PYTHONPATH=. python -m bench.decode_gemm --out $OUT [--budget-s 200]   # H200
    PYTHONPATH=. python -m bench.decode_gemm --smoke --out /tmp/d          # CPU, interpreter
    python -m bench.decode_gemm --write-table a/decode-gemm.json b/decode-gemm.json \
        --run-command "..." --run-commit C  # the table, from one or more GPU runs

Per launch (M x K x N_i; M = 1, 8, 16, 64): XLA's bf16 `x @ w_i`, one dot per weight
as stock Flax runs them (cuBLAS, or at M = 1 XLA's reduction), and our decode kernel
(all weights in one launch, row scale in the epilogue, `r` given) over a handful of
configs, and 64- and 128-column tiles with their K splits summed in a cluster
(`reduction="cluster"`, label "cl"; `decode_config.one_wave_cluster_split`).
`--launches single` (default): single weights at the presets' decode widths and a vocab
head; `--launches presets`: the 1B-class presets' own q/k/v, o and down
launches (bench/shapes.py's model dimensions); `--launches gemma`: Gemma-3-1B's o and down:
first the model's pick at every shape, then (while the budget lasts) the
alternatives, each pass measured interleaved with cuBLAS (two rounds, the
better median of each kept; ratios are to the same pass's cuBLAS) with
bench/timing.py: CUPTI kernel time summed over every kernel of the call (the
XLA reduction of split-K partials counts in ours), inputs rotated through
copies larger than L2. Each config's output is checked once against XLA's
float32 product before it is timed; a wrong config is reported, never timed.
Several weights' dots XLA merges into one GEMM plus a slice kernel per output, which a
model fuses into consumers: "its GEMM alone" leaves the slices out, as the table does
(`decode_table_writer.xla_slice_share`). Bandwidth is weight bytes over kernel time,
next to an XLA copy's bandwidth (read + write of a 512 MiB buffer) measured in the same
run. decode-gemm.json is rewritten after every shape; decode-gemm.md holds the table.
Shapes start only while the wall-clock budget lasts.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from bench import decode_table_writer, report, timing
from pallas_kernels import decode_config as dc
from pallas_kernels import decode_configs
from pallas_kernels import decode_matmul as dm

BF16 = jnp.bfloat16
Launch = tuple[int, tuple[int, ...]]  # (K, (N_1, N_2, ...)): the weights of one launch
# Single weights at the presets' decode widths and a vocab head (tests/test_cuda_lowering_decode.py).
LAUNCHES: dict[str, list[Launch]] = {
    "single": [(4096, (6144,)), (4096, (28672,)), (14336, (4096,)), (2048, (3072,)),
               (2048, (16384,)), (8192, (2048,)), (1024, (4096,)), (2048, (128256,))],
    # Llama-3.2-1B and Qwen3-0.6B decode: q/k/v in one launch, o, down.
    "presets": [(2048, (2048, 512, 512)), (2048, (2048,)), (8192, (2048,)),
                (1024, (2048, 1024, 1024)), (2048, (1024,)), (3072, (1024,))],
    # Gemma-3-1B decode: o and down, each followed by its post-norm (dense_rms_norm).
    "gemma": [(1024, (1152,)), (6912, (1152,))],
    # What `python -m bench.decode_plan` finds declined for want of a measurement:
    # Qwen3-4B's o, Qwen3-0.6B's o and down, Gemma-3-1B's q/k/v and o, Llama-3-8B's o,
    # down, q/k/v and head (run them at --rows 1,8,64).
    "unmeasured": [(4096, (2560,)), (2048, (1024,)), (3072, (1024,)), (1152, (1024, 256, 256)),
                   (1024, (1152,)), (4096, (4096,)), (14336, (4096,)),
                   (4096, (4096, 1024, 1024)), (4096, (32768,))],
    # The two of those the unmeasured run's budget did not reach at M = 8: Llama-3-8B's
    # q/k/v and its untied head.
    "llama3-8b": [(4096, (4096, 1024, 1024)), (4096, (32768,))],
}
# `--launches losing`: every launch of the measured table above cuBLAS, at its own M, with
# every candidate config in one pass (the runs that wrote the table tried two or three).
LOSING = "losing"
ROWS = (1, 8, 16, 64)
SMOKE_LAUNCHES, SMOKE_ROWS = [(128, (192,)), (128, (128, 64))], (8,)
COPY_BYTES, SMOKE_COPY_BYTES = 512 * 2**20, 2**20
# |ours - XLA float32| <= TOLERANCE * (|ref| + rms(ref)): bf16 rounding of the output is 2^-9.
TOLERANCE = 2**-7
ROUNDS = 2
TABLE_PATH = Path(dc.__file__).with_name("decode_configs.py")


def candidate_configs(m: int, k: int, ns: tuple[int, ...], sms: int) -> list[dc.DecodeConfig]:
    """The model's pick, then alternatives that differ most from each other first: 128-column
    tiles unsplit, 64-column tiles split to fill the SMs' waves, 256 unsplit, 128 split, 64
    unsplit, 64 split half and twice as many ways as the waves need."""
    k_iters = k // 64

    def fill(tile_n: int) -> int:
        """The fewest splits whose units fill >= 90% of the SMs' waves (else the best fill)."""
        tiles = sum(-(-n // tile_n) for n in ns)
        def waves_filled(s: int) -> float:
            return tiles * s / (-(-tiles * s // sms) * sms)
        splits = range(1, min(k_iters, 16) + 1)
        return next((s for s in splits if waves_filled(s) >= 0.9), max(splits, key=waves_filled))

    half, double = max(1, fill(64) // 2), min(2 * fill(64), k_iters, 16)
    shapes = [(128, 1), (64, fill(64)), (256, 1), (128, fill(128)), (64, 1), (64, half),
              (64, double)]
    picks = [dm.decode_config(m, k, ns, sms=sms)]
    picks += [dc.deepest(dc.DecodeConfig(tile_n=t, split_k=s), 2) for t, s in shapes]
    # 64- and 128-column tiles with their K splits summed in a cluster (no XLA reduction),
    # every tile's cluster resident at once, right after the first two so that a short
    # budget still compares the two reductions.
    clustered = []
    for tile_n in (64, 128):
        tiles = sum(-(-n // tile_n) for n in ns)
        if split := dc.one_wave_cluster_split(tiles, k_iters, sms):
            clustered.append(dc.deepest(dc.DecodeConfig(tile_n=tile_n, split_k=split,
                                                        reduction="cluster"), 2))
    return list(dict.fromkeys(picks[:2] + clustered + picks[2:]))


def losing_launches(rows: Sequence[int]) -> list[tuple[int, int, tuple[int, ...]]]:
    """(M, K, (N_i...)) of every table entry (pallas_kernels/decode_configs.py) measured
    slower than cuBLAS, at M in `rows`, the slowest first."""
    slow = sorted((e for e in decode_configs.ENTRIES if e[2] > 1.0 and e[0][0] in rows),
                  key=lambda e: -e[2])
    return [shape for shape, _, _ in slow]


def _label(config: dc.DecodeConfig) -> str:
    return (f"n{config.tile_n} s{config.split_k} st{config.stages}"
            + (f" wg{config.warpgroups}" if config.warpgroups > 1 else "")
            + (" cl" if config.cluster_splits else ""))


Args = tuple[jax.Array, list[jax.Array], jax.Array]


def _inputs(key: jax.Array, m: int, k: int, ns: tuple[int, ...]) -> Args:
    kx, kr, *kws = jax.random.split(key, 2 + len(ns))
    x = jax.random.normal(kx, (m, k), BF16)
    ws = [(jax.random.normal(kw, (k, n), jnp.float32) / k**0.5).astype(BF16)
          for kw, n in zip(kws, ns)]
    r = jax.random.uniform(kr, (m,), jnp.float32, 0.5, 1.5)
    return x, ws, r


def _ours(config: dc.DecodeConfig, interpret: bool) -> Callable[..., tuple[jax.Array, ...]]:
    def fn(x, ws, r):
        return dm.lazy_rms_decode_matmul(x, ws, row_scale=r, config=config, interpret=interpret)
    return fn


def _xla(x: jax.Array, ws: list[jax.Array], r: jax.Array) -> tuple[jax.Array, ...]:
    del r  # as users call it: one dot per weight, no row scale
    return tuple(x @ w for w in ws)


def worst_error(ys, x: jax.Array, ws: list[jax.Array], r: jax.Array) -> float:
    """max over outputs of |y - ref| / (|ref| + rms(ref)) against XLA's float32
    diag(r) (x @ w_i)."""
    worst = 0.0
    for y, w in zip(ys, ws, strict=True):
        ref = jnp.dot(x, w, preferred_element_type=jnp.float32) * r[:, None]
        rms = jnp.sqrt(jnp.mean(ref * ref))
        worst = max(worst, float(jnp.max(jnp.abs(y.astype(jnp.float32) - ref)
                                          / (jnp.abs(ref) + rms))))
    return worst


def copy_bandwidth(nbytes: int, repeats: int) -> float | None:
    """Bytes/s of an XLA elementwise copy (read + write) of an `nbytes` bf16 buffer."""
    sets = [(jnp.ones((nbytes // 2,), BF16),)]
    t = timing.measure(lambda a: a + jnp.asarray(1, BF16), sets, repeats=repeats, warmup=1)
    return 2 * nbytes / (t.best_us * 1e-6) if t.best_us else None


def _best(timings: list[timing.Timing]) -> dict[str, Any]:
    best = min(timings, key=lambda t: t.best_us)
    return dict(us=best.best_us, kernel_us=best.kernel_us, wall_us=best.wall_us,
                rounds_us=[t.best_us for t in timings], kernels=best.kernels,
                cupti_error=best.cupti_error)


def _checked(config: dc.DecodeConfig, first, interpret: bool) -> tuple[dict[str, Any], Any]:
    """(report entry, fn to time or None): a config is timed only if its output is right."""
    entry: dict[str, Any] = dict(label=_label(config), config=dataclasses.asdict(config))
    fn = _ours(config, interpret)
    try:
        entry["error"] = worst_error(jax.jit(fn)(*first), *first)
        entry["correct"] = entry["error"] <= TOLERANCE
    except Exception as err:  # a config that does not build is reported, not timed
        entry.update(correct=False, failure=f"{type(err).__name__}: {str(err)[:300]}")
    return entry, fn if entry["correct"] else None


def measure_configs(m: int, k: int, ns: tuple[int, ...], configs: list[dc.DecodeConfig], *,
                    repeats: int, interpret: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(cuBLAS, one entry per config): checked, then timed interleaved with cuBLAS."""
    key = jax.random.key(m * 131 + k * 7 + sum(ns) + len(ns))
    first = _inputs(key, m, k, ns)
    copies = 1 if interpret else timing.rotation_copies(
        sum(a.nbytes for a in jax.tree.leaves(first)))
    arg_sets = [first] + [_inputs(jax.random.fold_in(key, c), m, k, ns)
                          for c in range(1, copies)]
    fns: dict[str, Callable[..., jax.Array]] = {"xla": _xla}
    entries = []
    for config in configs:
        entry, fn = _checked(config, first, interpret)
        if fn is not None:
            fns[entry["label"]] = fn
        entries.append(entry)
    samples: dict[str, list[timing.Timing]] = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            samples[name].append(timing.measure(fn, arg_sets, repeats=repeats, warmup=1))
    xla = _best(samples.pop("xla"))
    weight_bytes = k * sum(ns) * 2
    xla["tb_s"] = weight_bytes / (xla["us"] * 1e-6) / 1e12
    for entry in entries:
        if entry["label"] in samples:
            entry.update(_best(samples[entry["label"]]))
            # Against the cuBLAS time measured in the same interleaved rounds.
            entry["ratio"] = entry["us"] / xla["us"]
            entry["tb_s"] = weight_bytes / (entry["us"] * 1e-6) / 1e12
    return xla, entries


def summarize(row: dict[str, Any], copy_bw: float | None) -> None:
    """The row's best config, its ratio to cuBLAS and its fraction of the copy bandwidth."""
    timed = [e for e in row["configs"] if "us" in e]
    if timed:
        best = min(timed, key=lambda e: e["ratio"])
        row["best"] = best["label"]
        row["ratio"] = best["ratio"]
        row["copy_fraction"] = (best["tb_s"] * 1e12 / copy_bw) if copy_bw else None
        row["pick_ratio"] = row["configs"][0].get("ratio")


def launch_label(m: int, k: int, ns: Sequence[int]) -> str:
    return f"{m}x{k}x" + (str(ns[0]) if len(ns) == 1 else f"({'+'.join(map(str, ns))})")


def table(rows: list[dict[str, Any]], copy_bw: float | None) -> report.TextTable:
    lines = []
    for row in rows:
        m, k, _ = row["shape"]
        best = next((e for e in row["configs"] if e["label"] == row.get("best")), None)
        lines.append([
            launch_label(m, k, row["ns"]), row.get("best", "none correct"),
            f"{row['weight_mb']:.1f}",
            report.fmt(row["xla"]["us"]), report.fmt(best["us"] if best else None),
            report.fmt(row.get("ratio"), 2),
            report.fmt(decode_table_writer.without_slices(row["ratio"], row["xla"])
                       if row.get("ratio") else None, 2),
            report.fmt(row.get("pick_ratio"), 2),
            report.fmt(best["tb_s"] if best else None, 2),
            report.fmt(row["xla"]["tb_s"], 2),
            report.fmt(100 * row["copy_fraction"] if row.get("copy_fraction") else None, 0),
        ])
    title = "decode GEMM vs cuBLAS" + (f" (copy {copy_bw / 1e12:.2f} TB/s)" if copy_bw else "")
    return report.TextTable(
        title, ["M x K x N_i", "best config", "weights MB", "cuBLAS us", "ours us", "ours/cuBLAS",
                "ours/its GEMM alone", "pick/cuBLAS", "ours TB/s", "cuBLAS TB/s", "% copy BW"],
        lines, left_columns=2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--budget-s", type=float, default=200.0)
    parser.add_argument("--configs", type=int, default=4,
                        help="configs per shape at most, the model's pick first")
    parser.add_argument("--launches", choices=[*sorted(LAUNCHES), LOSING], default="single",
                        help="single weights at the presets' widths, the 1B-class presets' "
                             "own q/k/v, o and down launches, ..., or 'losing': the table's "
                             "launches above cuBLAS, every candidate in one pass")
    parser.add_argument("--rows", type=lambda s: tuple(int(v) for v in s.split(",")),
                        default=ROWS, help="M values, e.g. 1,64 (default: 1,8,16,64)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes under the Pallas interpreter (CPU)")
    decode_table_writer.add_table_arguments(parser, "pallas_kernels/decode_configs.py",
                                            "python -m bench.decode_gemm")
    args = parser.parse_args(argv)
    if args.write_table:
        print(decode_table_writer.write_source(
            decode_table_writer.table_source, args.write_table, TABLE_PATH,
            command=args.run_command, commit=args.run_commit))
        return 0
    if any(not 1 <= m <= dc.MAX_ROWS for m in args.rows):
        parser.error(f"--rows must lie in [1, {dc.MAX_ROWS}]; got {args.rows}")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    interpret = args.smoke
    repeats = 1 if args.smoke else 10
    sms = 4 if args.smoke else jax.devices()[0].core_count
    copy_bw = copy_bandwidth(SMOKE_COPY_BYTES if args.smoke else COPY_BYTES, repeats)
    if args.launches == LOSING and not args.smoke:
        shapes = losing_launches(args.rows)
    else:
        shapes = [(m, k, ns)
                  for k, ns in (SMOKE_LAUNCHES if args.smoke else LAUNCHES[args.launches])
                  for m in (SMOKE_ROWS if args.smoke else args.rows)]
    payload: dict[str, Any] = dict(environment=report.environment(), smoke=args.smoke, sms=sms,
                                   copy_tb_s=copy_bw / 1e12 if copy_bw else None,
                                   budget_s=args.budget_s, rows=[], skipped=[])
    # Pass 1: the model's pick at every shape; pass 2: the alternatives, while the budget
    # lasts. The losing launches' picks were measured already: one pass of every candidate.
    rows = {}
    phases = ("all",) if args.launches == LOSING else ("pick", "alternatives")
    for phase in phases:
        for m, k, ns in shapes:
            if time.monotonic() - start > args.budget_s:
                payload["skipped"].append(dict(launch=launch_label(m, k, ns), phase=phase))
                continue
            configs = candidate_configs(m, k, ns, sms)
            configs = {"pick": configs[:1], "alternatives": configs[1:args.configs],
                       "all": configs[:args.configs]}[phase]
            if not configs:
                continue
            xla, entries = measure_configs(m, k, ns, configs, repeats=repeats,
                                           interpret=interpret)
            row = rows.setdefault((m, k, ns), dict(shape=[m, k, sum(ns)], ns=list(ns),
                                                   weight_mb=k * sum(ns) * 2 / 1e6, xla=xla,
                                                   configs=[]))
            row.setdefault("xla_by_phase", {})[phase] = xla
            row["configs"] += [dict(e, phase=phase) for e in entries]
            summarize(row, copy_bw)
            payload["rows"] = list(rows.values())
            payload["elapsed_s"] = time.monotonic() - start
            report.write_json(args.out / "decode-gemm.json", payload)
            print(f"{launch_label(m, k, ns)} {phase}: cuBLAS {xla['us']:.1f} us; "
                  + ", ".join(f"{e['label']} {e.get('ratio', 'wrong')}" for e in entries),
                  flush=True)
    payload["elapsed_s"] = time.monotonic() - start
    report.write_json(args.out / "decode-gemm.json", payload)
    skipped = ", ".join(f"{s['launch']} ({s['phase']})" for s in payload["skipped"]) or "none"
    rows_arg = ",".join(map(str, args.rows))
    preamble = [f"`PYTHONPATH=. python -m bench.decode_gemm --launches {args.launches} --rows "
                f"{rows_arg}` ({payload['elapsed_s']:.0f} s; "
                f"skipped for the budget: {skipped})."]
    report.write_markdown(args.out / "decode-gemm.md", "Decode GEMM", preamble,
                          [table(payload["rows"], copy_bw)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
