"""Sharded training and the row-parallel norm + GEMM over the GPUs of one host.

    PYTHONPATH=. python bench/multi_gpu.py --out $OUT            # every GPU of the host
    XLA_FLAGS=--xla_force_host_platform_device_count=8 PYTHONPATH=. \\
        python bench/multi_gpu.py --quick --out /tmp/mg            # tiny sizes on CPU

Two parts, each variant timed in one run with the others (bench.timing: wall
time, and CUPTI kernel time with the kernels' names where the profiler works):

- train: `examples/train_sharded.py`'s jitted AdamW step for a 1B-class
  (Llama-3.2-1B dims) and an 8B-class (Llama-3-8B dims) model with few layers,
  data parallel and tensor parallel over all devices, stock Flax (fused=False)
  vs jaxnorm (fused=True). Time in collectives: CUPTI's NCCL kernels; the
  bytes each collective moves: from the compiled HLO (bench.collectives). The
  sharded loss is checked against the same step on one device.
- forward: the same models' jitted forward (prefill) with parameters and tokens
  sharded for each layout: which Mosaic kernels jaxnorm's executable launches
  (CUPTI names, and the compiled HLO's Mosaic custom calls), so a sharded `jit`
  is seen to keep the kernels that an unsharded one picks.
- row_parallel: rms_norm_dense with x's K split over the devices
  (`axis_name`: [M] statistics and the [M, N] float32 outputs all-reduced)
  against all-gathering x, then the whole op on every device; values judged
  against verify's float64 reference and tolerance model.

Writes multi-gpu.json and multi-gpu.md under --out (default $OUT, else a temp dir).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxnorm
from flax import nnx

from bench import model_suite, timing
from bench.collectives import Collective, compiled_collectives
from examples import train_sharded
from jaxnorm import models
from verify import checks

# Public configurations with few layers: the per-layer cost is what a layout changes.
PRESETS = {
    "llama3.2-1b": dict(d_model=2048, d_ff=8192, n_heads=32, n_kv_heads=8, head_dim=64,
                        vocab_size=128256, n_layers=4),
    "llama3-8b": dict(d_model=4096, d_ff=14336, n_heads=32, n_kv_heads=8, head_dim=128,
                      vocab_size=128256, n_layers=2),
}
QUICK_PRESETS = {"tiny": dict(d_model=64, d_ff=128, n_heads=8, n_kv_heads=8, head_dim=8,
                              vocab_size=128, n_layers=1)}
LOSS_RTOL = 2e-2  # bfloat16 end to end: sharded and one-device sums round differently


def _flat_step(step, state):
    leaves, treedef = jax.tree.flatten(state)
    return (lambda *xs: step(*jax.tree.unflatten(treedef, xs))), tuple(leaves)


def _collective_summary(found: list[Collective]) -> dict[str, Any]:
    by_kind: dict[str, dict[str, int]] = {}
    for c in found:
        entry = by_kind.setdefault(c.kind, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += c.bytes
    return {"by_kind": by_kind, "bytes": sum(c.bytes for c in found),
            "list": [c.describe() for c in found]}


def _nccl_us(t: timing.Timing) -> float | None:
    if not t.kernels:
        return None
    return sum(us for name, us in t.kernels if "nccl" in name.lower())


def train_rows(presets: dict, layouts: list[str], batch: int, seq_len: int,
               repeats: int, dtype) -> list[dict[str, Any]]:
    rows = []
    tp = jax.device_count()
    for preset, dims in presets.items():
        for layout in layouts:
            for variant, fused in (("stock", False), ("jaxnorm", True)):
                cfg = models.llama(fused=fused, dtype=dtype, param_dtype=dtype, **dims)
                mesh = train_sharded.make_mesh(layout, tp=tp)
                step, state = train_sharded.sharded_train_step(cfg, mesh, layout, batch=batch,
                                                               seq_len=seq_len)
                fn, leaves = _flat_step(step, state)
                t = timing.measure(fn, [leaves], repeats=repeats, warmup=2)
                loss = float(step(*state)[0])
                one = train_sharded.make_mesh(layout, tp=1, devices=jax.devices()[:1])
                step1, state1 = train_sharded.sharded_train_step(cfg, one, layout, batch=batch,
                                                                 seq_len=seq_len)
                loss1 = float(step1(*state1)[0])
                rows.append({
                    "part": "train", "preset": preset, "layout": layout, "variant": variant,
                    "devices": jax.device_count(), "mesh": dict(mesh.shape), "batch": batch,
                    "seq_len": seq_len, "wall_us": t.wall_us, "kernel_us": t.kernel_us,
                    "nccl_us": _nccl_us(t), "kernels": t.kernels, "cupti_error": t.cupti_error,
                    "collectives": _collective_summary(compiled_collectives(fn, *leaves)),
                    "loss": loss, "loss_one_device": loss1,
                    "loss_matches": bool(abs(loss - loss1) <= LOSS_RTOL * abs(loss1)),
                })
                del state, leaves, state1
    return rows


def _mosaic_calls(fn, *args) -> int:
    """Mosaic GPU custom calls in fn's compiled HLO (0 wherever dispatch chose xla)."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    return text.count('custom_call_target="mosaic_gpu')


def forward_rows(presets: dict, layouts: list[str], batch: int, seq_len: int,
                 repeats: int, dtype) -> list[dict[str, Any]]:
    rows = []
    for preset, dims in presets.items():
        for layout in layouts:
            for variant, fused in (("stock", False), ("jaxnorm", True)):
                cfg = models.llama(fused=fused, dtype=dtype, param_dtype=dtype, **dims)
                mesh = train_sharded.make_mesh(layout, tp=jax.device_count())
                train_sharded.check_divisible(cfg, mesh, batch)
                graphdef, params = nnx.split(models.Transformer(cfg, rngs=nnx.Rngs(0)))
                params = jax.device_put(params, jax.tree_util.tree_map_with_path(
                    lambda path, _: NamedSharding(mesh, train_sharded.param_spec(path, layout)),
                    params))
                tokens = jax.device_put(
                    jax.random.randint(jax.random.key(1), (batch, seq_len), 0, cfg.vocab_size),
                    NamedSharding(mesh, P("data", None)))

                def forward(p, toks):
                    return nnx.merge(graphdef, p)(toks)[0]

                fn, leaves = _flat_step(lambda p, t: forward(p, t), (params, tokens))
                t = timing.measure(fn, [leaves], repeats=repeats, warmup=2)
                mosaic = sorted({name for name, _ in t.kernels or []
                                 if model_suite.kernel_class(name) == "mosaic"})
                rows.append({
                    "part": "forward", "preset": preset, "layout": layout, "variant": variant,
                    "devices": jax.device_count(), "mesh": dict(mesh.shape), "batch": batch,
                    "seq_len": seq_len, "wall_us": t.wall_us, "kernel_us": t.kernel_us,
                    "kernels": t.kernels, "cupti_error": t.cupti_error,
                    "mosaic_kernels": mosaic, "mosaic_custom_calls": _mosaic_calls(fn, *leaves),
                })
                del params, leaves
    return rows


def _row_parallel_fns(mesh):
    def row_parallel(x, scale, w):
        return jaxnorm.rms_norm_dense(x, scale, w, axis_name="model")

    def gather_then_op(x, scale, w):
        x = jax.lax.all_gather(x, "model", axis=1, tiled=True)
        scale = jax.lax.all_gather(scale, "model", tiled=True)
        return jaxnorm.rms_norm_dense(x, scale, w)

    return {
        "row_parallel": jax.shard_map(row_parallel, mesh=mesh,
                                      in_specs=(P(None, "model"), P("model"), P("model", None)),
                                      out_specs=P()),
        # The gathered x is typed varying although every device holds all of it.
        "all_gather_x": jax.shard_map(gather_then_op, mesh=mesh,
                                      in_specs=(P(None, "model"), P("model"), P()),
                                      out_specs=P(), check_vma=False),
    }


def row_parallel_rows(m: int, k: int, n: int, repeats: int, dtype) -> list[dict[str, Any]]:
    mesh = jax.make_mesh((jax.device_count(),), ("model",))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(dtype)
    scale = (1 + 0.2 * rng.standard_normal(k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype)
    judged = checks.judge("rms_norm_dense", None, {"x": x, "scale": scale, "kernel": w})[0]
    rows = []
    for name, fn in _row_parallel_fns(mesh).items():
        specs = (P(None, "model"), P("model"), P("model", None) if name == "row_parallel" else P())
        args = tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip((x, scale, w),
                                                                                specs))
        t = timing.measure(fn, [args], repeats=repeats)
        found = compiled_collectives(fn, *args)
        y = np.asarray(jax.jit(fn)(*args), np.float64)
        excess = float(np.max(np.abs(y - judged.expected) / judged.tolerance))
        stats = [c for c in found if all(s == (m,) for _, s in c.arrays)]
        rows.append({
            "part": "row_parallel", "variant": name, "devices": jax.device_count(),
            "m": m, "k": k, "n": n, "wall_us": t.wall_us, "kernel_us": t.kernel_us,
            "nccl_us": _nccl_us(t), "kernels": t.kernels, "cupti_error": t.cupti_error,
            "collectives": _collective_summary(found),
            "statistics_bytes": sum(c.bytes for c in stats),
            "x_all_gather_bytes": m * k * np.dtype(dtype).itemsize,
            "worst_error_over_tolerance": excess, "within_tolerance": excess <= 1.0,
        })
    return rows


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def markdown(rows: list[dict[str, Any]], device: str) -> str:
    lines = [f"# Sharded training and row-parallel norms on {rows[0]['devices']} x {device}", "",
             "## Training step (examples/train_sharded.py, AdamW)", "",
             "| preset | layout | variant | wall us | kernel us | NCCL us | collective bytes"
             " | loss = one device | jaxnorm / stock |", "|---|---|---|---|---|---|---|---|---|"]
    train = [r for r in rows if r["part"] == "train"]
    for r in train:
        stock = next(s for s in train if s["preset"] == r["preset"] and
                     s["layout"] == r["layout"] and s["variant"] == "stock")
        ratio = (r["kernel_us"] or r["wall_us"]) / (stock["kernel_us"] or stock["wall_us"])
        lines.append(f"| {r['preset']} | {r['layout']} | {r['variant']} | {_us(r['wall_us'])} | "
                     f"{_us(r['kernel_us'])} | {_us(r['nccl_us'])} | "
                     f"{r['collectives']['bytes']} | {r['loss_matches']} | {ratio:.3f} |")
    lines += ["", "## Forward (prefill), sharded jit: the Mosaic kernels jaxnorm keeps", "",
              "| preset | layout | variant | wall us | kernel us | Mosaic custom calls | "
              "Mosaic kernels launched |", "|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["part"] == "forward"):
        lines.append(f"| {r['preset']} | {r['layout']} | {r['variant']} | {_us(r['wall_us'])} | "
                     f"{_us(r['kernel_us'])} | {r['mosaic_custom_calls']} | "
                     f"{', '.join(r['mosaic_kernels']) or '-'} |")
    lines += ["", "## rms_norm_dense with K split over the devices", "",
              "| variant | M x K x N | wall us | kernel us | NCCL us | statistics bytes | "
              "all bytes | all-gather of x would move | within tolerance |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["part"] == "row_parallel"):
        lines.append(f"| {r['variant']} | {r['m']}x{r['k']}x{r['n']} | {_us(r['wall_us'])} | "
                     f"{_us(r['kernel_us'])} | {_us(r['nccl_us'])} | {r['statistics_bytes']} | "
                     f"{r['collectives']['bytes']} | {r['x_all_gather_bytes']} | "
                     f"{r['within_tolerance']} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=Path(os.environ.get("OUT") or tempfile.mkdtemp()))
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CPU host devices)")
    parser.add_argument("--layouts", default="data,tensor")
    parser.add_argument("--parts", default="train,forward,row_parallel",
                        help="which parts to run (comma-separated)")
    parser.add_argument("--repeats", type=int, default=20)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    layouts, parts = args.layouts.split(","), args.parts.split(",")
    if args.quick:
        presets, batch, seq_len, repeats, dtype = (QUICK_PRESETS, jax.device_count(), 16, 3,
                                                   jnp.float32)
        row_parallel_shape, row_dtype = (64, 64 * jax.device_count(), 64), np.float32
    else:
        presets, batch, seq_len, repeats, dtype = (PRESETS, 4 * jax.device_count(), 1024,
                                                   args.repeats, jnp.bfloat16)
        row_parallel_shape, row_dtype = (8192, 4096, 4096), jnp.bfloat16
    rows = []
    if "train" in parts:
        rows += train_rows(presets, layouts, batch, seq_len, repeats, dtype)
    if "forward" in parts:
        rows += forward_rows(presets, layouts, batch, seq_len, repeats, dtype)
    if "row_parallel" in parts:
        rows += row_parallel_rows(*row_parallel_shape, repeats, row_dtype)
    args.out.mkdir(parents=True, exist_ok=True)
    device = jax.devices()[0].device_kind
    (args.out / "multi-gpu.json").write_text(json.dumps(
        {"device": device, "devices": jax.device_count(), "rows": rows}, indent=1, default=str))
    (args.out / "multi-gpu.md").write_text(markdown(rows, device))
    print(markdown(rows, device))
    return rows


if __name__ == "__main__":
    main()
