"""The decode MLP input group (pallas_kernels/decode_gated.py) against XLA at the presets' shapes.

    PYTHONPATH=. python -m bench.decode_groups --out $OUT [--budget-s 120] [--shapes 1152x6912]
    PYTHONPATH=. python -m bench.decode_groups --smoke --out /tmp/d          # CPU, interpreter

Per shape (M x K x (d_ff + d_ff); M = 1, 8, 64; K x d_ff and activation of Llama-3.2-1B,
Qwen3-0.6B, Qwen3-4B, Llama-3-8B and Gemma-3-1B), four variants:

- "decode gated": the kernel with the gain folded (as `jaxnorm.rms_norm_gated_dense(scale=None,
  impl="mosaic")` runs it), so one launch with the row statistic in the kernel (the model's
  pick, then with `--configs` > 1 the other candidate tiles of `decode_config.GATED_TILES`);
- "decode gated, gain unfolded": `jaxnorm.rms_norm_gated_dense(x, gain, impl="mosaic")`, as an
  unflashified model runs it: XLA scales x by the gain and takes the statistic, then the kernel;
- "stock": what stock Flax runs (impl="xla"): the norm with its gain in float32 cast to
  bf16, two bf16 dots, act(gate) * up;
- "dots + act": XLA's two dots and act(gate) * up with no norm at all (the floor).

Each variant's output is checked once before it is timed (a wrong one is reported, never
timed): the kernel's and stock's by verify's float64 judge (`verify.gated.check_gated`), the
floor's against float64 within 2^-6 of |ref| + rms(ref). Then all are measured interleaved
(ROUNDS rounds, each variant once per round, the better median kept; ratios are to the same
rounds' stock and floor) with bench/timing.py: CUPTI kernel time summed over every kernel of
the call, inputs rotated through copies larger than L2. decode-groups.json is rewritten after
every shape; decode-groups.md holds the table. Shapes start only while the budget lasts.

`--write-table RUN.json... --run-command ... --run-commit ...` turns runs into
jaxnorm/backends/decode_gated_measured.py, the ratios automatic dispatch reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bench import decode_gemm, decode_table_writer, report, timing
from jaxnorm.backends import decode_gated_measured
from pallas_kernels import decode_config as dc
from pallas_kernels.interpreter_flags import use_interpreter_safe_xla_flags

BF16 = jnp.bfloat16
# (K, d_ff, activation): tests/test_cuda_lowering_decode_gated.py's presets.
SHAPES = [(2048, 8192, "silu"), (1024, 3072, "silu"), (2560, 9728, "silu"),
          (4096, 14336, "silu"), (1152, 6912, "gelu_tanh")]
ROWS = (1, 8, 64)
SMOKE_SHAPES, SMOKE_ROWS = [(128, 192, "silu")], (8,)
FLOOR_TOLERANCE = 2**-6
ROUNDS = 2
UNFOLDED, STOCK, FLOOR = "decode gated, gain unfolded", "stock", "dots + act"
BASELINES = (UNFOLDED, STOCK, FLOOR)  # every label but these is a kernel config
TABLE_PATH = Path(decode_gated_measured.__file__)


def candidate_configs(m: int, k: int, n: int, sms: int) -> list[dc.DecodeConfig]:
    """The model's pick first, then the one-warpgroup tiles with the K splits summed in a
    cluster (`decode_config.one_wave_cluster_split`), then the other
    GATED_TILES unsplit; each as deep as SMEM allows."""
    picks = [dc.gated_decode_config(m, k, n, sms=sms)]
    for tile_n in (64, 128):
        if split := dc.one_wave_cluster_split(-(-n // tile_n), k // 64, sms):
            picks.append(dc.deepest(dc.DecodeConfig(tile_n=tile_n, split_k=split,
                                                    reduction="cluster"), 2, streams=2))
    picks += [dc.deepest(dc.DecodeConfig(tile_n=t, warpgroups=w), 2, streams=2)
              for t, w in dc.GATED_TILES]
    return list(dict.fromkeys(picks))


def _label(config: dc.DecodeConfig) -> str:
    return (f"decode gated n{config.tile_n} st{config.stages}"
            + (f" wg{config.warpgroups}" if config.warpgroups > 1 else "")
            + (f" s{config.split_k} cl" if config.cluster_splits else ""))


def _inputs(key: jax.Array, m: int, k: int, n: int) -> tuple[jax.Array, ...]:
    """(x, gain, W_gate, W_up): the kernel takes the weights as folded (no gain)."""
    kx, kg, kw, ku = jax.random.split(key, 4)
    x = jax.random.normal(kx, (m, k), BF16)
    g = 1 + 0.1 * jax.random.normal(kg, (k,), jnp.float32)
    wg, wu = ((jax.random.normal(kk, (k, n), jnp.float32) / k**0.5).astype(BF16)
              for kk in (kw, ku))
    return x, g, wg, wu


def _variants(configs: list[dc.DecodeConfig], activation: str,
              interpret: bool) -> dict[str, Callable[..., jax.Array]]:
    """label -> fn(x, gain, W_gate, W_up); the kernel ignores the gain (folded)."""
    import jaxnorm
    from jaxnorm.backends import xla_gated
    from pallas_kernels import decode_gated

    act = xla_gated.ACTIVATIONS[activation]

    def ours(config, x, g, wg, wu):
        del g  # folded into the weights
        return decode_gated.decode_gated_rms_matmul(x, wg, wu, activation=activation,
                                                    config=config, interpret=interpret)

    def unfolded(x, g, wg, wu):
        return jaxnorm.rms_norm_gated_dense(x, g, wg, wu, activation=activation,
                                            impl="interpret" if interpret else "mosaic")

    def stock(x, g, wg, wu):
        return jaxnorm.rms_norm_gated_dense(x, g, wg, wu, activation=activation, impl="xla")

    def floor(x, g, wg, wu):
        del g
        return act(x @ wg) * (x @ wu)

    fns = {_label(c): functools.partial(ours, c) for c in configs}
    return {**fns, UNFOLDED: unfolded, STOCK: stock, FLOOR: floor}


def floor_error(y: jax.Array, x: jax.Array, wg: jax.Array, wu: jax.Array,
                activation: str) -> float:
    """max |y - ref| / (|ref| + rms(ref)) against act(x @ W_gate) * (x @ W_up) in float64."""
    from verify import gated

    x64 = np.asarray(x, np.float64)
    ref = gated.activation(activation, x64 @ np.asarray(wg, np.float64)) * (
        x64 @ np.asarray(wu, np.float64))
    rms = np.sqrt(np.mean(ref * ref))
    return float(np.max(np.abs(np.asarray(y, np.float64) - ref) / (np.abs(ref) + rms)))


def check(label: str, fn: Callable[..., jax.Array], first: tuple[jax.Array, ...],
          activation: str) -> dict[str, Any]:
    """The entry of one variant: err/tol (error for the floor) and whether it may be timed."""
    from verify import gated

    x, g, wg, wu = first
    entry: dict[str, Any] = dict(label=label)
    try:
        y = jax.jit(fn)(*first)
        if label == FLOOR:
            entry["error"] = floor_error(y, x, wg, wu, activation)
            entry["correct"] = entry["error"] <= FLOOR_TOLERANCE
        else:
            folded = label not in BASELINES
            entry["err_tol"] = gated.check_gated(
                y, x, None if folded else g, wg, wu, activation_name=activation,
                act_dtype=None if label == STOCK else jnp.float32)
            entry["correct"] = True
    except Exception as err:  # a wrong or failing variant is reported, not timed
        entry.update(correct=False, failure=f"{type(err).__name__}: {str(err)[:300]}")
    return entry


def measure_shape(m: int, k: int, n: int, activation: str, configs: list[dc.DecodeConfig], *,
                  repeats: int, interpret: bool) -> list[dict[str, Any]]:
    """One entry per variant: checked, then the correct ones timed interleaved."""
    key = jax.random.key(m * 131 + k * 7 + n)
    first = _inputs(key, m, k, n)
    copies = 1 if interpret else timing.rotation_copies(sum(a.nbytes for a in first))
    arg_sets = [first] + [_inputs(jax.random.fold_in(key, c), m, k, n) for c in range(1, copies)]
    fns = _variants(configs, activation, interpret)
    entries = [check(label, fn, first, activation) for label, fn in fns.items()]
    for entry, config in zip(entries, configs):
        entry["config"] = dataclasses.asdict(config)
    time_interleaved(entries, fns, arg_sets, repeats=repeats, weight_bytes=2 * k * n * 2,
                     baselines=((STOCK, "vs_stock"), (FLOOR, "vs_floor")))
    return entries


def time_interleaved(entries: list[dict[str, Any]], fns: dict[str, Callable[..., Any]],
                     arg_sets: list[tuple[Any, ...]], *, repeats: int, weight_bytes: int,
                     baselines: tuple[tuple[str, str], ...]) -> None:
    """Time the correct entries interleaved (ROUNDS rounds, each variant once per round,
    the better kept), then add their weight TB/s and, per (label, key) of `baselines`, the
    ratio to that baseline measured in the same rounds."""
    timed = {e["label"]: fns[e["label"]] for e in entries if e["correct"]}
    samples: dict[str, list[timing.Timing]] = {label: [] for label in timed}
    for _ in range(ROUNDS):
        for label, fn in timed.items():
            samples[label].append(timing.measure(fn, arg_sets, repeats=repeats, warmup=1))
    for entry in entries:
        if entry["label"] in samples:
            # The better round, as bench/decode_gemm.py keeps it.
            entry.update(decode_gemm._best(samples[entry["label"]]))
            entry["tb_s"] = weight_bytes / (entry["us"] * 1e-6) / 1e12
    by_label = {e["label"]: e for e in entries}
    for entry in entries:
        for name, key in baselines:
            if "us" in entry and "us" in by_label[name]:
                entry[key] = entry["us"] / by_label[name]["us"]


def table(rows: list[dict[str, Any]]) -> report.TextTable:
    lines = []
    for row in rows:
        m, k, n = row["shape"]
        by_label = {e["label"]: e for e in row["variants"]}
        kernels = [e for e in row["variants"] if e["label"] not in BASELINES]
        best = min((e for e in kernels if "us" in e), key=lambda e: e["us"], default=None)
        lines.append([
            f"{m}x{k}x({n}+{n})", row["activation"], best["label"] if best else "none correct",
            report.fmt(best["us"] if best else None),
            report.fmt(by_label[STOCK].get("us")), report.fmt(by_label[FLOOR].get("us")),
            report.fmt(best.get("vs_stock") if best else None, 2),
            report.fmt(best.get("vs_floor") if best else None, 2),
            report.fmt(best["tb_s"] if best else None, 2),
            report.fmt(by_label[UNFOLDED].get("vs_stock"), 2),
        ])
    return report.TextTable(
        "decode MLP input: decode gated kernel (gain folded) vs XLA",
        ["M x K x (d_ff + d_ff)", "act", "best kernel config", "kernel us", "stock us",
         "dots + act us", "kernel/stock", "kernel/floor", "kernel TB/s",
         "unfolded/stock"], lines, left_columns=3)


def _shape_filter(text: str) -> set[tuple[int, int]]:
    """"1152x6912,1024x3072" -> {(1152, 6912), (1024, 3072)}; each must be one of SHAPES."""
    known = {(k, n) for k, n, _ in SHAPES + SMOKE_SHAPES}
    picked = set()
    for item in text.split(","):
        try:
            k, n = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not K x d_ff, e.g. 1152x6912")
        if (k, n) not in known:
            raise argparse.ArgumentTypeError(
                f"{item!r} is none of the shapes: {', '.join(f'{a}x{b}' for a, b in sorted(known))}")
        picked.add((k, n))
    return picked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--budget-s", type=float, default=120.0)
    parser.add_argument("--configs", type=int, default=1,
                        help="kernel configs per shape at most, the model's pick first")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes under the Pallas interpreter (CPU)")
    parser.add_argument("--shapes", type=_shape_filter, default=None,
                        help="K x d_ff of SHAPES to run, comma-separated (default: all)")
    decode_table_writer.add_table_arguments(
        parser, "jaxnorm/backends/decode_gated_measured.py", "python -m bench.decode_groups")
    args = parser.parse_args(argv)
    if args.write_table:
        print(decode_table_writer.write_source(
            decode_table_writer.gated_table_source, args.write_table, TABLE_PATH,
            command=args.run_command, commit=args.run_commit))
        return 0
    if args.smoke:
        use_interpreter_safe_xla_flags()  # before jax computes anything
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    interpret = args.smoke
    repeats = 1 if args.smoke else 10
    sms = 4 if args.smoke else jax.devices()[0].core_count
    shapes = [(m, k, n, act) for k, n, act in (SMOKE_SHAPES if args.smoke else SHAPES)
              if args.shapes is None or (k, n) in args.shapes
              for m in (SMOKE_ROWS if args.smoke else ROWS)]
    payload: dict[str, Any] = dict(environment=report.environment(), smoke=args.smoke, sms=sms,
                                   budget_s=args.budget_s, rows=[], skipped=[])
    for m, k, n, activation in shapes:
        if time.monotonic() - start > args.budget_s:
            payload["skipped"].append([m, k, n])
            continue
        configs = candidate_configs(m, k, n, sms)[:args.configs]
        entries = measure_shape(m, k, n, activation, configs, repeats=repeats,
                                interpret=interpret)
        payload["rows"].append(dict(shape=[m, k, n], activation=activation,
                                    weight_mb=2 * k * n * 2 / 1e6, variants=entries))
        payload["elapsed_s"] = time.monotonic() - start
        report.write_json(args.out / "decode-groups.json", payload)
        print(f"{m}x{k}x({n}+{n}) {activation}: "
              + ", ".join(f"{e['label']} {e.get('us', 'not timed')}" for e in entries),
              flush=True)
    payload["elapsed_s"] = time.monotonic() - start
    report.write_json(args.out / "decode-groups.json", payload)
    skipped = ", ".join("x".join(map(str, s)) for s in payload["skipped"]) or "none"
    preamble = [f"`PYTHONPATH=. python -m bench.decode_groups` ({payload['elapsed_s']:.0f} s; "
                f"skipped for the budget: {skipped})."]
    report.write_markdown(args.out / "decode-groups.md", "Decode MLP input group", preamble,
                          [table(payload["rows"])])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
