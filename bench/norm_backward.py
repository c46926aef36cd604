"""RMSNorm's backward kernel (pallas_kernels/rms_norm_backward.py) against JAX's autodiff of
the stock norm, at the model presets' training norms.

    PYTHONPATH=. python -m bench.norm_backward --out $OUT [--budget-s 120]
    PYTHONPATH=. python -m bench.norm_backward --smoke --out /tmp/nb          # CPU, interpreter
    PYTHONPATH=. python -m bench.norm_backward --write-table $OUT/norm-backward.json \
        --run-commit abc1234                       # -> jaxnorm/backends/norm_backward_measured.py
    PYTHONPATH=. python -m bench.norm_backward --configs --out $OUT [--shapes 2048x1152]
    PYTHONPATH=. python -m bench.norm_backward --write-configs $OUT/norm-backward-configs.json \
        --run-commit abc1234              # -> pallas_kernels/rms_norm_backward_configs.py

Per shape (M x K: a preset's training rows of d_model, and its QK-norm heads' rows of
head_dim), bf16, with a gain (the unfolded model) and without (flashified): (x, G) ->
(dx, d scale) two ways,

- "kernel": `jaxnorm.backends.mosaic_norm_backward` (one launch, x and G read once, plus
  XLA's sum of the gain's per-block column partials);
- "stock": JAX's VJP of the stock norm (`jaxnorm.backends.xla.rms_norm_vjp`), what a
  training step runs for the norm today.

A d_model norm reads the residual stream, so in a step x's gradient is the norm's dx plus
the stream's own cotangent R, which XLA adds inside the stock backward's last fusion and
in a separate pass after the kernel: at those shapes both variants return dx + R (with R
an input), at the heads' shapes (QK-norm, no stream) dx alone. There a third variant,
"kernel, stream added in it", takes R as the kernel's addend: what an op that returns x for
the stream runs (`return_input=True`, docs/backward.md); the table keeps both. A d_model norm that feeds several GEMMs (a gated MLP's gate and up,
the attention input's q, k and v) gets one cotangent from each: `--cotangents` times those
rows with 2 and 3 of them, which "stock" and "kernel" take summed (XLA's add) and "kernel,
stream added in it" sums as it reads them (`return_input=True` hands it each consumer's).

Each output is judged against the float64 VJP first (a wrong one is reported, never timed);
then both are timed interleaved (bench/decode_groups.py's rounds, CUPTI kernel time, inputs
rotated through copies larger than L2). The op alone is not the model: in a training step
XLA fuses the stock backward with its neighbours (the residual stream's gradient add), so
the model suite's variant "norm backward kernel" (bench/gpu/variant_probe.py) is the test
that decides; this table is what automatic dispatch reads.

`--configs` times, per shape (with a gain; at d_model rows with the stream's cotangent added
in the kernel, as the fused model runs it), every config of
`rms_norm_backward.backward_candidates` (rows per block, row blocks per CTA) and the
selected one's kernel alone, without XLA's sum of its column partials, against stock;
`--write-configs` makes the fastest at each shape the kernel's selection there.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bench import decode_groups, decode_table_writer, report, timing
from bench.gemm_table_writer import module_header
from bench.model_suite import SHAPES
from bench.shapes import parse_dims
from jaxnorm.backends import norm_backward_measured
from pallas_kernels import rms_norm_backward as backward_kernel
from pallas_kernels import rms_norm_backward_configs
from pallas_kernels.interpreter_flags import use_interpreter_safe_xla_flags

BF16 = jnp.bfloat16
KERNEL, STOCK, KERNEL_ADD = "kernel", "stock", "kernel, stream added in it"
SMOKE_SHAPES = [(16, 256)]
TABLE_PATH = Path(norm_backward_measured.__file__)
CONFIGS_PATH = Path(rms_norm_backward_configs.__file__)
CONFIGS_COMMAND = "python -m bench.norm_backward --configs"
TABLE_COMMAND = "python -m bench.norm_backward"


def training_shapes() -> list[tuple[int, int]]:
    """(M, K) of every preset's training norms: d_model rows, then QK-norm head rows of the
    queries and, where no query shape is within 2x in M (dispatch's reach), of the keys."""
    shapes = []
    for shape in SHAPES.values():
        c, rows = shape.cfg, shape.train[0] * shape.train[1]
        shapes.append((rows, c.d_model))
        if c.qk_norm:
            shapes.append((rows * c.n_heads, c.head_dim))
            if c.n_heads > 2 * c.n_kv_heads:
                shapes.append((rows * c.n_kv_heads, c.head_dim))
    return list(dict.fromkeys(shapes))


def _inputs(key: jax.Array, m: int, k: int, cotangents: int = 1) -> tuple[jax.Array, ...]:
    """(x, R, gain, G_1, ... G_n): activations, the residual stream's own cotangent, a gain
    near 1, and the cotangents of the normed activations from its n consumers."""
    kx, kr, ks, *kg = jax.random.split(key, 3 + cotangents)
    return (jax.random.normal(kx, (m, k), BF16), jax.random.normal(kr, (m, k), BF16),
            1 + 0.1 * jax.random.normal(ks, (k,), jnp.float32),
            *(jax.random.normal(kgi, (m, k), BF16) for kgi in kg))


def _summed(gs: tuple[jax.Array, ...]) -> jax.Array:
    """The consumers' cotangents added as JAX adds them (in their dtype)."""
    return functools.reduce(jnp.add, gs)


def _variants(with_gain: bool, stream: bool, interpret: bool,
              cotangents: int = 1) -> dict[str, Callable[..., Any]]:
    """label -> fn(x, R, gain, *G) -> (dx [+ R], d scale or None). With several cotangents
    "stock" and "kernel" take their sum (XLA's add, fused into the stock backward, a pass
    of its own before the kernel), "kernel, stream added in it" sums them as it reads."""
    from jaxnorm import dispatch
    from jaxnorm.backends import xla

    impl = "interpret" if interpret else "mosaic"

    def plus_stream(grads, r):
        dx, d_scale = grads
        return (dx + r if stream else dx), d_scale

    def kernel(x, r, scale, *gs):
        return plus_stream(dispatch.call("rms_norm_backward", impl, x, _summed(gs),
                                         scale if with_gain else None, eps=1e-6,
                                         scale_offset=0.0), r)

    def kernel_add(x, r, scale, *gs):
        return dispatch.call("rms_norm_backward", impl, x, gs if len(gs) > 1 else gs[0],
                             scale if with_gain else None, r, eps=1e-6, scale_offset=0.0)

    def stock(x, r, scale, *gs):
        return plus_stream(xla.rms_norm_vjp(x, _summed(gs), scale if with_gain else None,
                                            eps=1e-6, scale_offset=0.0), r)

    return {KERNEL: kernel, STOCK: stock, **({KERNEL_ADD: kernel_add} if stream else {})}


def check(label: str, fn: Callable[..., Any], first: tuple[jax.Array, ...],
          with_gain: bool, stream: bool) -> dict[str, Any]:
    """The variant's entry: its err/tol against the float64 VJP of the cotangents' exact sum
    (plus R where the stream's cotangent is part of the output), and whether it is right."""
    from verify import checks

    x, r, scale, *gs = (np.asarray(a) for a in first)
    g = sum(gi.astype(np.float64) for gi in gs)
    entry: dict[str, Any] = dict(label=label)
    try:
        dx, d_scale = jax.jit(fn)(*first)
        entry["err_tol"] = checks.check_rms_norm_backward(
            dx, d_scale, x=x, g=g, scale=scale if with_gain else None, eps=1e-6,
            stream=r if stream else None)
        entry["correct"] = True
    except Exception as err:  # a wrong or failing variant is reported, not timed
        entry.update(correct=False, failure=f"{type(err).__name__}: {str(err)[:300]}")
    return entry


def measure_shape(m: int, k: int, with_gain: bool, stream: bool, *, repeats: int,
                  interpret: bool, cotangents: int = 1) -> list[dict[str, Any]]:
    key = jax.random.key(m * 31 + k + 7919 * (cotangents - 1))
    first = _inputs(key, m, k, cotangents)
    copies = 1 if interpret else timing.rotation_copies(sum(a.nbytes for a in first))
    arg_sets = [first] + [_inputs(jax.random.fold_in(key, c), m, k, cotangents)
                          for c in range(1, copies)]
    fns = _variants(with_gain, stream, interpret, cotangents)
    entries = [check(label, fn, first, with_gain, stream) for label, fn in fns.items()]
    decode_groups.time_interleaved(entries, fns, arg_sets, repeats=repeats,
                                   weight_bytes=(1 + cotangents) * m * k * 2,
                                   baselines=((STOCK, "vs_stock"),))
    return entries


def config_label(config: backward_kernel.BackwardConfig, m: int) -> str:
    """'4 rows x 2 blocks, 256 CTAs': rows per block, blocks per CTA, the grid."""
    return f"{config.rows.block_m} rows x {config.steps} blocks, {config.ctas(m)} CTAs"


ALONE = "selected, kernel alone (partials unsummed)"


def measure_configs(m: int, k: int, stream: bool, *, repeats: int, interpret: bool,
                    num_sms: int) -> list[dict[str, Any]]:
    """Stock and every candidate config at (m, k) with a gain (the stream's cotangent added in
    the kernel where `stream`), each checked against float64 first, timed interleaved; the
    selected config (the first) also without XLA's sum of its partials (not checked: its
    d scale is the partials)."""
    from jaxnorm.backends import xla

    key = jax.random.key(m * 37 + k)
    first = _inputs(key, m, k)
    copies = 1 if interpret else timing.rotation_copies(sum(a.nbytes for a in first))
    arg_sets = [first] + [_inputs(jax.random.fold_in(key, c), m, k) for c in range(1, copies)]
    configs = backward_kernel.backward_candidates(m, k, BF16, num_sms=num_sms, addend=stream)

    def run(config, sum_partials=True):
        def fn(x, r, scale, g):
            return backward_kernel.rms_norm_backward(
                x, g, scale, r if stream else None, eps=1e-6, scale_offset=0.0,
                config=config, interpret=interpret, sum_partials=sum_partials)
        return fn

    def stock(x, r, scale, g):
        dx, d_scale = xla.rms_norm_vjp(x, g, scale, eps=1e-6, scale_offset=0.0)
        return (dx + r if stream else dx), d_scale

    fns: dict[str, Callable[..., Any]] = {STOCK: stock}
    fns.update({config_label(c, m): run(c) for c in configs})
    entries = [check(label, fn, first, True, stream) for label, fn in fns.items()]
    for entry, config in zip(entries[1:], configs):
        entry.update(block_m=config.rows.block_m, steps=config.steps,
                     ctas=config.ctas(m),
                     selected=config == configs[0])
    fns[ALONE] = run(configs[0], sum_partials=False)
    entries.append(dict(label=ALONE, correct=True))
    decode_groups.time_interleaved(entries, fns, arg_sets, repeats=repeats,
                                   weight_bytes=2 * m * k * 2, baselines=((STOCK, "vs_stock"),))
    return entries


def configs_table(rows: Sequence[dict[str, Any]]) -> report.TextTable:
    lines = []
    for row in rows:
        by_label = {e["label"]: e for e in row["variants"]}
        timed = [e for e in row["variants"] if "ctas" in e and "us" in e]
        best = min(timed, key=lambda e: e["us"], default={})
        selected = next((e for e in timed if e.get("selected")), {})
        lines.append(["x".join(map(str, row["shape"])), "+ R" if row["stream"] else "",
                      report.fmt(by_label[STOCK].get("us")),
                      selected.get("label", "-"), report.fmt(selected.get("vs_stock"), 3),
                      report.fmt(by_label[ALONE].get("vs_stock"), 3),
                      best.get("label", "-"), report.fmt(best.get("vs_stock"), 3),
                      f"{len(timed)} of {sum('ctas' in e for e in row['variants'])}"])
    return report.TextTable(
        "RMSNorm backward configs, bf16, with a gain (CUPTI; ratios over stock's time)",
        ["M x K", "stream", "stock us", "selected", "selected / stock",
         "selected alone / stock", "best", "best / stock", "timed"], lines, left_columns=4)


def run_configs(args: argparse.Namespace, start: float, sms: int) -> int:
    shapes = args.shapes or (SMOKE_SHAPES if args.smoke else training_shapes())
    payload: dict[str, Any] = dict(environment=report.environment(), smoke=args.smoke, sms=sms,
                                   budget_s=args.budget_s, rows=[], skipped=[])
    for m, k in shapes:
        if time.monotonic() - start > args.budget_s:
            payload["skipped"].append([m, k])
            continue
        stream = stream_rows(k) or args.smoke
        entries = measure_configs(m, k, stream, repeats=1 if args.smoke else 10,
                                  interpret=args.smoke, num_sms=sms)
        payload["rows"].append(dict(shape=[m, k], gain=True, stream=stream, variants=entries))
        payload["elapsed_s"] = time.monotonic() - start
        report.write_json(args.out / "norm-backward-configs.json", payload)
        print(f"{m}x{k}: " + ", ".join(f"{e['label']} {e.get('us', e.get('failure', '-'))}"
                                       for e in entries), flush=True)
    skipped = ", ".join("x".join(map(str, s)) for s in payload["skipped"]) or "none"
    report.write_markdown(args.out / "norm-backward-configs.md", "RMSNorm backward configs",
                          [f"`python -m bench.norm_backward --configs` "
                           f"({time.monotonic() - start:.0f} s; skipped for the budget: "
                           f"{skipped})."], [configs_table(payload["rows"])])
    return 0


def _gpu_runs(docs: Sequence[dict[str, Any]], command: str,
              commit: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The GPU runs among `docs` (a --smoke run makes no table) and a table's PROVENANCE from
    the last of them."""
    gpu = [d for d in docs if not d.get("smoke")]
    if not gpu:
        raise ValueError("a table needs a GPU run, not --smoke")
    env = gpu[-1]["environment"]
    return gpu, dict(command=command, date=env["date_utc"], device=env["devices"][0],
                     sms=gpu[-1]["sms"], commit=commit)


def configs_source(docs: Sequence[dict[str, Any]], command: str, commit: str) -> str:
    """pallas_kernels/rms_norm_backward_configs.py from `--configs` runs: per shape the
    fastest correct config (a shape measured twice: the later run's)."""
    gpu, provenance = _gpu_runs(docs, command, commit)
    entries = {}
    for doc in gpu:
        for row in doc["rows"]:
            timed = [e for e in row["variants"] if "ctas" in e and "vs_stock" in e]
            if timed:
                best = min(timed, key=lambda e: e["us"])
                selected = next(e for e in timed if e["selected"])
                entries[tuple(row["shape"])] = (best["block_m"], best["steps"],
                                                best["vs_stock"], selected["vs_stock"])
    lines = module_header(rms_norm_backward_configs.__doc__,
                          "The run: command, UTC date, GPU, its SM count, commit.", provenance)
    lines += ["# ((M, K), dtype name, rows per block, row blocks per CTA, its time / stock's,",
              "#  the selection's before this table / stock's): the fastest config measured.",
              "ENTRIES: tuple[tuple[tuple[int, int], str, int, int, float, float], ...] = ("]
    lines += [f"    ({shape!r}, 'bfloat16', {bm}, {steps}, {best:.3f}, {before:.3f}),"
              for shape, (bm, steps, best, before) in entries.items()]
    return "\n".join(lines + [")", ""])


def _rows_to_measure(args: argparse.Namespace) -> list[tuple[int, int, bool, bool, int]]:
    """(M, K, with a gain, with the stream's cotangent, cotangents of the normed x) to time:
    each shape with and without a gain; d_model rows (the stream's) with each of
    `--cotangents`, a head's rows (QK-norm: one consumer) with one. --smoke covers both
    forms at its one shape, with the stream's cotangent and every count where it has the
    gain."""
    rows = []
    for m, k in args.shapes or (SMOKE_SHAPES if args.smoke else training_shapes()):
        for with_gain in (True, False):
            stream = with_gain if args.smoke else stream_rows(k)
            for cotangents in args.cotangents if stream else [1]:
                rows.append((m, k, with_gain, stream, cotangents))
    return rows


def stream_rows(k: int) -> bool:
    """Whether rows of K are a d_model norm's (the residual stream's) in some preset."""
    return any(shape.cfg.d_model == k for shape in SHAPES.values())


def table(rows: Sequence[dict[str, Any]]) -> report.TextTable:
    lines = []
    for row in rows:
        by_label = {e["label"]: e for e in row["variants"]}
        kernel, stock = by_label[KERNEL], by_label[STOCK]
        fused = by_label.get(KERNEL_ADD, {})
        lines.append(["x".join(map(str, row["shape"])), "yes" if row["gain"] else "folded",
                      "+ R" if row.get("stream") else "", str(row.get("cotangents", 1)),
                      report.fmt(kernel.get("us")), report.fmt(stock.get("us")),
                      report.fmt(kernel.get("vs_stock"), 3), report.fmt(fused.get("vs_stock"), 3),
                      report.fmt(kernel.get("tb_s"), 2), report.fmt(kernel.get("err_tol"), 3)])
    return report.TextTable(
        "RMSNorm backward, bf16 (CUPTI us; TB/s of x and G read)",
        ["M x K", "gain", "stream", "G", "kernel us", "stock us", "kernel / stock",
         "stream added in it / stock", "kernel TB/s", "kernel err/tol"], lines, left_columns=4)


def table_source(docs: Sequence[dict[str, Any]], command: str, commit: str) -> str:
    """jaxnorm/backends/norm_backward_measured.py from GPU runs (a shape measured twice: the
    later run's)."""
    gpu, provenance = _gpu_runs(docs, command, commit)
    entries = {}
    for doc in gpu:
        for row in doc["rows"]:
            by_label = {e["label"]: e for e in row["variants"]}
            cotangents = row.get("cotangents", 1)  # runs before 2026-12-07 took one
            for label, added in ((KERNEL, False), (KERNEL_ADD, True)):
                if cotangents > 1 and not added:
                    continue  # the op sums its cotangents in the kernel or not at all
                if "vs_stock" in by_label.get(label, {}):
                    saved = by_label[STOCK]["us"] - by_label[label]["us"]
                    entries[(tuple(row["shape"]), row["gain"], added, cotangents)] = (
                        by_label[label]["vs_stock"], saved)
    lines = module_header(norm_backward_measured.__doc__,
                          "The run: command, UTC date, GPU, its SM count, commit.", provenance)
    lines += ["# ((M, K), dtype name, with a gain, with the stream's cotangent added in it, "
              "cotangents of",
              "#  the normed x summed in it, kernel / stock autodiff of the norm's backward, "
              "microseconds",
              "#  saved a launch).",
              "ENTRIES: tuple[tuple[tuple[int, int], str, bool, bool, int, float, float], ...] "
              "= ("]
    lines += [f"    ({shape!r}, 'bfloat16', {gain!r}, {added!r}, {count}, {ratio:.3f}, "
              f"{saved:.1f}),"
              for (shape, gain, added, count), (ratio, saved) in entries.items()]
    return "\n".join(lines + [")", ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--budget-s", type=float, default=120.0)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny shape under the Pallas interpreter (CPU)")
    parser.add_argument("--configs", action="store_true",
                        help="time every candidate config of the kernel against stock")
    parser.add_argument("--shapes", type=lambda s: parse_dims(s, 2),
                        default=None, help="MxK,... (default: the presets')")
    parser.add_argument("--cotangents", type=lambda s: [int(c) for c in s.split(",")],
                        default=[1, 2, 3],
                        help="cotangents of the normed x summed in the kernel, at d_model "
                             "rows (1: one consumer; 2: gate and up; 3: q, k and v)")
    decode_table_writer.add_table_arguments(
        parser, "jaxnorm/backends/norm_backward_measured.py", TABLE_COMMAND)
    parser.add_argument("--write-configs", metavar="CONFIGS_JSON", type=Path, nargs="+",
                        help="write pallas_kernels/rms_norm_backward_configs.py from --configs "
                             "runs' JSON and exit")
    args = parser.parse_args(argv)
    if args.write_configs:
        command = (CONFIGS_COMMAND if args.run_command == TABLE_COMMAND
                   else args.run_command)
        print(decode_table_writer.write_source(configs_source, args.write_configs, CONFIGS_PATH,
                                               command=command, commit=args.run_commit))
        return 0
    if args.write_table:
        print(decode_table_writer.write_source(table_source, args.write_table, TABLE_PATH,
                                               command=args.run_command.strip(),
                                               commit=args.run_commit))
        return 0
    if args.smoke:
        use_interpreter_safe_xla_flags()  # before jax computes anything
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    sms = 4 if args.smoke else jax.devices()[0].core_count
    if args.configs:
        return run_configs(args, start, sms)
    payload: dict[str, Any] = dict(environment=report.environment(), smoke=args.smoke, sms=sms,
                                   budget_s=args.budget_s, rows=[], skipped=[])
    for m, k, with_gain, stream, cotangents in _rows_to_measure(args):
        if time.monotonic() - start > args.budget_s:
            payload["skipped"].append([m, k, with_gain, cotangents])
            continue
        entries = measure_shape(m, k, with_gain, stream, repeats=1 if args.smoke else 10,
                                interpret=args.smoke, cotangents=cotangents)
        payload["rows"].append(dict(shape=[m, k], gain=with_gain, stream=stream,
                                    cotangents=cotangents, variants=entries))
        payload["elapsed_s"] = time.monotonic() - start
        report.write_json(args.out / "norm-backward.json", payload)
        print(f"{m}x{k} gain={with_gain} cotangents={cotangents}: " + ", ".join(
            f"{e['label']} {e.get('us', e.get('failure', 'not timed'))}" for e in entries),
            flush=True)
    skipped = ", ".join("x".join(map(str, s[:2])) for s in payload["skipped"]) or "none"
    report.write_markdown(args.out / "norm-backward.md", "RMSNorm backward",
                          [f"`python -m bench.norm_backward` ({time.monotonic() - start:.0f} s;"
                           f" skipped for the budget: {skipped})."], [table(payload["rows"])])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
