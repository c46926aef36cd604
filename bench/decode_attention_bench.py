"""The decode attention-input group (pallas_kernels/decode_attention_input.py) against XLA.

    PYTHONPATH=. python -m bench.decode_attention_bench --out $OUT [--budget-s 120]   # H200
    PYTHONPATH=. python -m bench.decode_attention_bench --smoke --out /tmp/a          # CPU
    PYTHONPATH=. python -m bench.decode_attention_bench --write-table RUN.json ...   # the table

Per preset (d_model, q heads, kv heads, head_dim of Qwen3-0.6B, Qwen3-4B, Gemma-3-1B: the
QK-norm presets of bench/model_suite.py) x M = 1, 8, 64 rows (the batch, one position per
row), four or five variants, each returning (q, k, v) in the standard head layout:

- "attention input kernel": one launch with the input gain folded (the row statistic in the
  kernel), QK-norm and RoPE in the epilogue, the weights as stored and cos/sin given (one
  table per step, shared by every layer; `rope_tables`);
- "kernel, gain unfolded": the same with the input gain given: XLA scales x first;
- "kernel, K split in a cluster": the folded kernel with each head's K split
  over the CTAs of a cluster, as many as fill the SMs (at most 8), rank 0 summing the
  partials before the QK-norm and RoPE (the input statistic then one XLA reduction);
- "stock": what the stock model runs (jaxnorm/models: Block._qkv then Attention.__call__):
  RMSNorm with its gain (OffsetRMSNorm's flax convention: float32, cast to bf16), three bf16
  dots, per-head q_norm and k_norm (the same convention, Gemma's 1 + g where the preset has
  it), then `layers.rope` at the rows' positions;
- "three dots": x @ W_q, W_k, W_v alone (the floor: no norm, no QK-norm, no RoPE).

Each variant's outputs are checked once before timing (a wrong one is reported, never timed):
the kernels' and stock's by verify's float64 judge (`verify.rope.check_attention_input`), the
floor's against float64 within 2^-6 of |ref| + rms(ref). Then all are measured interleaved
(`decode_groups.time_interleaved`: two rounds, the better median kept) with bench/timing.py:
CUPTI kernel time summed over every kernel of the call, inputs rotated through copies larger
than L2. The JSON is rewritten after every shape; decode-attention.md holds the table.
`--write-table` turns runs into jaxnorm/backends/decode_attention_measured.py, the ratios
automatic dispatch reads (jaxnorm/backends/mosaic_attention_input.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bench import decode_groups, decode_table_writer, report, timing
from pallas_kernels.interpreter_flags import use_interpreter_safe_xla_flags

BF16, F32 = jnp.bfloat16, jnp.float32
EPS = 1e-6
ROPE_THETA = 1e6
ROWS = (1, 8, 64)
FLOOR_TOLERANCE = 2**-6
TABLE_PATH = Path(__file__).resolve().parents[1] / "jaxnorm/backends/decode_attention_measured.py"
KERNEL, UNFOLDED, STOCK, FLOOR = ("attention input kernel", "kernel, gain unfolded", "stock",
                                  "three dots")
CLUSTER = "kernel, K split in a cluster"


class Preset(NamedTuple):
    name: str
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    qk_offset: float  # Gemma's norms scale by 1 + g
    qk_norm: bool = True  # Llama has none: q and k are only rotated


PRESETS = [Preset("qwen3-0.6b", 1024, 16, 8, 128, 0.0), Preset("qwen3-4b", 2560, 32, 8, 128, 0.0),
           Preset("gemma3-1b", 1152, 4, 1, 256, 1.0),
           Preset("llama3-8b", 4096, 32, 8, 128, 0.0, qk_norm=False)]
SMOKE_PRESETS = [Preset("smoke", 128, 2, 1, 128, 1.0),
                 Preset("smoke-llama", 128, 2, 1, 128, 0.0, qk_norm=False)]
SMOKE_ROWS = (8,)


class Inputs(NamedTuple):
    """One argument set: every variant takes all of it (the stock one the positions, the
    kernel the cos/sin tables)."""

    x: jax.Array
    gain: jax.Array
    w_q: jax.Array
    w_k: jax.Array
    w_v: jax.Array
    q_gain: jax.Array
    k_gain: jax.Array
    positions: jax.Array
    cos: jax.Array
    sin: jax.Array


def inputs(key: jax.Array, m: int, p: Preset) -> Inputs:
    """Fresh draws: x, gains near their unit value, weights / sqrt(d), a position per row."""
    from jaxnorm.models import layers
    from pallas_kernels import decode_attention_input as dai

    kx, kg, kq, kk, kv, kqg, kkg, kp = jax.random.split(key, 8)
    d, hd = p.d_model, p.head_dim
    w = {name: (jax.random.normal(kw, (d, heads * hd), F32) / d**0.5).astype(BF16)
         for name, kw, heads in (("q", kq, p.n_heads), ("k", kk, p.n_kv_heads),
                                 ("v", kv, p.n_kv_heads))}
    centre = 1.0 - p.qk_offset
    positions = jax.random.randint(kp, (m,), 0, 4096)
    cos, sin = dai.rope_tables(positions, layers.rope_frequencies(hd, ROPE_THETA, None))
    return Inputs(
        x=jax.random.normal(kx, (m, d), BF16),
        gain=centre + 0.1 * jax.random.normal(kg, (d,), F32),
        w_q=w["q"], w_k=w["k"], w_v=w["v"],
        q_gain=centre + 0.1 * jax.random.normal(kqg, (hd,), F32),
        k_gain=centre + 0.1 * jax.random.normal(kkg, (hd,), F32),
        positions=positions, cos=cos, sin=sin)


def _stock_norm(x: jax.Array, gain: jax.Array, offset: float) -> jax.Array:
    """jaxnorm.models.layers.OffsetRMSNorm's flax convention: float32, gain, cast."""
    x32 = x.astype(F32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + EPS)
    return (y * (offset + gain)).astype(x.dtype)


def stock(a: Inputs, p: Preset) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The stock model's attention input at decode: rows are the batch, one step each."""
    from jaxnorm.models import layers

    m, hd = a.x.shape[0], p.head_dim
    h = _stock_norm(a.x, a.gain, p.qk_offset)
    q, k, v = h @ a.w_q, h @ a.w_k, h @ a.w_v
    q, k = q.reshape(m, 1, p.n_heads, hd), k.reshape(m, 1, p.n_kv_heads, hd)
    if p.qk_norm:
        q, k = _stock_norm(q, a.q_gain, p.qk_offset), _stock_norm(k, a.k_gain, p.qk_offset)
    inv_freq = layers.rope_frequencies(hd, ROPE_THETA, None)
    positions = a.positions[:, None]  # [B, T = 1]
    q, k = layers.rope(q, positions, inv_freq), layers.rope(k, positions, inv_freq)
    return q.reshape(m, -1), k.reshape(m, -1), v


def _qk_gains(a: Inputs, p: Preset) -> tuple[jax.Array | None, jax.Array | None]:
    """The QK-norm gains where the preset has QK-norm (the draws are ignored otherwise)."""
    return (a.q_gain, a.k_gain) if p.qk_norm else (None, None)


def kernel(a: Inputs, p: Preset, *, unfolded: bool, config, interpret: bool):
    """The kernel (gain folded: the kernel's weights stand for diag(g) W, judged as such)."""
    from pallas_kernels import decode_attention_input as dai

    q_gain, k_gain = _qk_gains(a, p)
    return dai.decode_attention_input(
        a.x, (a.w_q, a.w_k, a.w_v), head_dim=p.head_dim, q_gain=q_gain, k_gain=k_gain, cos=a.cos,
        sin=a.sin, qk_eps=EPS, qk_offset=p.qk_offset, eps=EPS,
        scale=a.gain if unfolded else None, scale_offset=p.qk_offset, config=config,
        interpret=interpret)


def floor(a: Inputs, p: Preset):
    del p
    return a.x @ a.w_q, a.x @ a.w_k, a.x @ a.w_v


def variants(p: Preset, config, interpret: bool,
             cluster_config=None) -> dict[str, Callable[[Inputs], Any]]:
    """The kernel (gain folded, unfolded), with `cluster_config` also the folded kernel with
    each head's K splits in a cluster, stock, and the floor."""
    fns = {KERNEL: functools.partial(kernel, p=p, unfolded=False, config=config,
                                     interpret=interpret),
           UNFOLDED: functools.partial(kernel, p=p, unfolded=True, config=config,
                                       interpret=interpret)}
    if cluster_config is not None:
        fns[CLUSTER] = functools.partial(kernel, p=p, unfolded=False, config=cluster_config,
                                         interpret=interpret)
    return {**fns, STOCK: functools.partial(stock, p=p), FLOOR: functools.partial(floor, p=p)}


def cluster_config(m: int, p: Preset, *, sms: int, interpret: bool):
    """The kernel's config with each head's K split over the CTAs of a cluster (at most 8, 2
    under the interpreter), every head's cluster resident at once
    (`decode_config.one_wave_cluster_split`); None where none fits."""
    from pallas_kernels import decode_attention_input as dai
    from pallas_kernels import decode_config as dc
    from pallas_kernels import hardware

    heads = p.n_heads + 2 * p.n_kv_heads
    limit = hardware.INTERPRET_MAX_CLUSTER if interpret else hardware.MAX_CLUSTER
    split = (min(limit, p.d_model // 64) if interpret  # the interpreter has no residency
             else dc.one_wave_cluster_split(heads, p.d_model // 64, sms, limit))
    if split is None or split < 2:
        return None
    return dc.deepest(dc.DecodeConfig(tile_n=p.head_dim // 2, split_k=split,
                                      reduction="cluster"), 2, streams=2,
                      constants=dai.constants_bytes(p.head_dim))


def judge(label: str, outs, a: Inputs, p: Preset) -> dict[str, Any]:
    """err/tol (verify.rope) of a kernel or stock; the floor's error against float64."""
    from verify import rope

    if label == FLOOR:
        x64 = np.asarray(a.x, np.float64)
        errors = []
        for y, w in zip(outs, (a.w_q, a.w_k, a.w_v)):
            ref = x64 @ np.asarray(w, np.float64)
            rms = np.sqrt(np.mean(ref * ref))
            errors.append(float(np.max(np.abs(np.asarray(y, np.float64) - ref)
                                       / (np.abs(ref) + rms))))
        return dict(error=max(errors), correct=max(errors) <= FLOOR_TOLERANCE)
    scale = None if label in (KERNEL, CLUSTER) else a.gain  # the folded kernels
    ratio = rope.check_attention_input(
        *outs, a.x, scale, a.w_q, a.w_k, a.w_v, *_qk_gains(a, p), a.cos, a.sin,
        head_dim=p.head_dim, eps=EPS, scale_offset=p.qk_offset, qk_eps=EPS,
        qk_offset=p.qk_offset)
    return dict(err_tol=ratio, correct=True)


def measure_shape(m: int, p: Preset, *, repeats: int, interpret: bool,
                  sms: int) -> list[dict[str, Any]]:
    """One entry per variant: checked, then the correct ones timed interleaved."""
    from pallas_kernels import decode_attention_input as dai

    config = dai.attention_input_config(m, p.d_model, p.n_heads + 2 * p.n_kv_heads,
                                        p.head_dim, sms=sms)
    key = jax.random.key(m * 131 + p.d_model)
    first = inputs(key, m, p)
    copies = 1 if interpret else timing.rotation_copies(
        sum(a.nbytes for a in jax.tree.leaves(first)))
    arg_sets = [(first,)] + [(inputs(jax.random.fold_in(key, c), m, p),)
                             for c in range(1, copies)]
    split = cluster_config(m, p, sms=sms, interpret=interpret)
    fns = variants(p, config, interpret, split)
    entries = []
    for label, fn in fns.items():
        entry: dict[str, Any] = dict(label=label)
        if label in (KERNEL, UNFOLDED, CLUSTER):
            entry["config"] = dataclasses.asdict(split if label == CLUSTER else config)
        try:
            entry.update(judge(label, jax.jit(fn)(first), first, p))
        except Exception as err:  # a wrong or failing variant is reported, not timed
            entry.update(correct=False, failure=f"{type(err).__name__}: {str(err)[:300]}")
        entries.append(entry)
    decode_groups.time_interleaved(
        entries, fns, arg_sets, repeats=repeats,
        weight_bytes=sum(w.nbytes for w in (first.w_q, first.w_k, first.w_v)),
        baselines=((STOCK, "vs_stock"), (FLOOR, "vs_floor")))
    return entries


def table(rows: list[dict[str, Any]]) -> report.TextTable:
    lines = []
    for row in rows:
        e = {v["label"]: v for v in row["variants"]}
        split = e.get(CLUSTER, {})
        lines.append([
            row["preset"], str(row["m"]), report.fmt(e[KERNEL].get("us")),
            report.fmt(e[UNFOLDED].get("us")), report.fmt(split.get("us")),
            report.fmt(e[STOCK].get("us")),
            report.fmt(e[FLOOR].get("us")), report.fmt(e[KERNEL].get("vs_stock"), 2),
            report.fmt(e[UNFOLDED].get("vs_stock"), 2), report.fmt(split.get("vs_stock"), 2),
            report.fmt(e[KERNEL].get("vs_floor"), 2), report.fmt(e[KERNEL].get("tb_s"), 2)])
    return report.TextTable(
        "decode attention input: one kernel (norm, q/k/v, QK-norm, RoPE) vs XLA",
        ["preset", "M", "kernel us", "unfolded us", "K split us", "stock us", "three dots us",
         "kernel/stock", "unfolded/stock", "K split/stock", "kernel/floor", "kernel TB/s"],
        lines,
        left_columns=2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--budget-s", type=float, default=120.0)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny preset under the Pallas interpreter (CPU)")
    parser.add_argument("--presets", type=lambda v: v.split(","),
                        default=[p.name for p in PRESETS],
                        help=f"comma-separated (default: {','.join(p.name for p in PRESETS)})")
    parser.add_argument("--rows", type=lambda v: tuple(int(m) for m in v.split(",")),
                        default=ROWS, help="comma-separated M (default: 1,8,64)")
    decode_table_writer.add_table_arguments(
        parser, str(TABLE_PATH), "python -m bench.decode_attention_bench")
    args = parser.parse_args(argv)
    if args.write_table:
        print(decode_table_writer.write_source(
            decode_table_writer.attention_table_source, args.write_table, TABLE_PATH,
            command=args.run_command, commit=args.run_commit))
        return 0
    unknown = set(args.presets) - {p.name for p in PRESETS}
    if unknown:
        parser.error(f"--presets: unknown {sorted(unknown)}; known {[p.name for p in PRESETS]}")
    if args.smoke:
        use_interpreter_safe_xla_flags()  # before jax computes anything
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    sms = 4 if args.smoke else jax.devices()[0].core_count
    presets = SMOKE_PRESETS if args.smoke else [p for p in PRESETS if p.name in args.presets]
    shapes = [(m, p) for p in presets for m in (SMOKE_ROWS if args.smoke else args.rows)]
    payload: dict[str, Any] = dict(environment=report.environment(), smoke=args.smoke, sms=sms,
                                   budget_s=args.budget_s, rows=[], skipped=[])
    for m, p in shapes:
        if time.monotonic() - start > args.budget_s:
            payload["skipped"].append([p.name, m])
            continue
        entries = measure_shape(m, p, repeats=1 if args.smoke else 10, interpret=args.smoke,
                                sms=sms)
        payload["rows"].append(dict(preset=p.name, m=m, shape=p._asdict(), variants=entries))
        payload["elapsed_s"] = time.monotonic() - start
        report.write_json(args.out / "decode-attention.json", payload)
        print(f"{p.name} M={m}: "
              + ", ".join(f"{e['label']} {e.get('us', 'not timed')}" for e in entries),
              flush=True)
    payload["elapsed_s"] = time.monotonic() - start
    report.write_json(args.out / "decode-attention.json", payload)
    skipped = ", ".join(f"{n} M={m}" for n, m in payload["skipped"]) or "none"
    preamble = [f"`PYTHONPATH=. python -m bench.decode_attention_bench` "
                f"({payload['elapsed_s']:.0f} s; skipped for the budget: {skipped})."]
    report.write_markdown(args.out / "decode-attention.md", "Decode attention input group",
                          preamble, [table(payload["rows"])])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
