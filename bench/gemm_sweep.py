"""Tuning sweep of our plain GEMM against cuBLAS, and the table it feeds (issue 17, item 4).

    PYTHONPATH=. python -m bench.gemm_sweep --out $OUT [--budget-s 420] [--shapes MxKxN,...]
    PYTHONPATH=. python -m bench.gemm_sweep --write-table $OUT/gemm_sweep.json
    PYTHONPATH=. python -m bench.gemm_sweep --quick --out /tmp/q    # CPU: interpreter, tiny shapes

For each (M, K, N) it times XLA's bf16 `x @ w` (cuBLAS) and `plain_matmul` under a list of
configs with `bench.timing.measure` (CUPTI kernel time, inputs rotated through copies larger
than L2), cuBLAS re-timed after every few configs and its median taken (interleaved against
clock drift). Each config's output is checked once against XLA's (relative Frobenius error
<= REL_TOL) before it is timed; a wrong config is reported and never timed. A config the
kernel refuses (`Unsupported`) or that does not fit SMEM (`gemm_config.smem_bytes`) is
skipped with its reason. The JSON is rewritten after every shape, so a timeout keeps what was
measured (and names the config running, should one hang the GPU: after CONFIG_TIMEOUT_S the
process exits with a traceback); past `--budget-s` the sweep stops before the next config and
marks the shapes it did not finish "partial" or "untimed".

Pruning (the full product of the knobs is ~300 configs per shape, ~1.5 s each; `Plan`):
1. Screen: at `Plan.screen_shapes` (M = 8192: square, wide, narrow) every CTA tile x grid
   minor dimension x 2-CTA cluster (none, along N, along M) (`gemm_candidates.screen`: grid
   tile width 8, deepest fitting pipeline, 64x64 epilogue tile), and each shape's
   `default_config`.
2. Refine: the `refine_top` best of the screen (geometric mean of time / cuBLAS over the
   screen shapes), each with grid tile width 4 and 16, a 4-stage pipeline and a 64x128
   epilogue tile (`gemm_candidates.refinements`), timed at the screen shapes.
3. Every other shape: its `default_config` and the `top_k` best configs of steps 1-2.
That is 3 x (25 + 8) + 37 x 4 configs: ~6.5 minutes on an H200 at 1.5 s a config.

`--screen-all` screens (and refines) every listed shape, not only the screen shapes: for a few
shapes the table's picks lose at. `--write-table` takes several sweeps' JSON; a shape in more
than one takes the last run's best.

`--unmeasured` prints the shapes (default: the presets') without a table entry of their own,
in the form `--shapes` takes: what the next `--screen-all` should measure.

`--around-table` skips steps 1-3: every shape times its `default_config` (the table's pick)
and that config with one wgmma step in flight (`gemm_candidates.in_flight_variants`), a
knob the table's sweep did not have: 3 configs a shape, all 40 shapes in ~5 minutes.
`--pingpong` does the same with pingpong warpgroups (`gemm_candidates.pingpong_variants`: each
MMA warpgroup a whole tile in turn, one's epilogue under the other's mainloop).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import faulthandler
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from bench import gemm_candidates as candidates
from bench import timing
from bench.shapes import parse_mkn
from pallas_kernels.errors import Unsupported
from pallas_kernels.gemm_config import (TuningConfig, check_shapes, config_fields,
                                        config_from_fields, default_config)
from pallas_kernels.plain_matmul import plain_matmul

Shape = tuple[int, int, int]
# (K, N) of the prefill/training GEMMs (qkv, o, gate/up, down) of the model presets.
MODEL_KNS = (
    (4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096),  # Llama-3-8B
    (2048, 3072), (2048, 2048), (2048, 16384), (8192, 2048),  # Llama-3.2-1B
    (1024, 4096), (2048, 1024), (1024, 6144), (3072, 1024),  # Qwen3-0.6B
    (2560, 6144), (4096, 2560), (2560, 19456), (9728, 2560),  # Qwen3-4B
)
# Gemma-3-1B's, at the model suite's rows for it (prefill 4 x 1024, training 2 x 1024).
GEMMA_KNS = ((1152, 1536), (1024, 1152), (1152, 13824), (6912, 1152))
SHAPES: tuple[Shape, ...] = (tuple((m, k, n) for m in (8192, 4096) for k, n in MODEL_KNS)
                             + tuple((m, k, n) for m in (4096, 2048) for k, n in GEMMA_KNS))
CUBLAS_EVERY = 4  # configs between two cuBLAS timings of a shape
# bf16 outputs of the same f32 sums differ by output rounding (~2^-9 relative, RMS); a
# missing or misplaced tile is O(1).
REL_TOL = 1e-2
FIRST_COST_S = 2.0  # cost of a config before one has been measured (compile + timing)
CONFIG_TIMEOUT_S = 120.0  # a config still running after this is taken as hung
JSON_NAME, MD_NAME = "gemm_sweep.json", "gemm_sweep.md"
TABLE_PATH = Path(__file__).resolve().parents[1] / "pallas_kernels" / "gemm_configs.py"


@dataclasses.dataclass(frozen=True)
class Plan:
    """How much the sweep tries (module docstring): screen shapes, how many configs go on."""

    screen_shapes: tuple[Shape, ...] = ((8192, 4096, 4096), (8192, 4096, 28672),
                                        (8192, 2048, 2048))
    refine_top: int = 2
    top_k: int = 3
    max_screen: int | None = None  # configs of the screen list tried (None: all)
    repeats: int = 20
    warmup: int = 2
    interpret: bool = False
    clusters: bool = True  # screen 2-CTA clusters too
    around_table: bool = False  # only each shape's table pick and its in-flight variants
    pingpong: bool = False  # only each shape's table pick and pingpong configs
    screen_all: bool = False  # every shape is a screen shape


# CPU: the interpreter at tiny shapes, two screen configs (the second clustered), one refined,
# one carried on.
QUICK_SHAPES: tuple[Shape, ...] = ((128, 64, 512), (64, 64, 128))
QUICK_PLAN = Plan(screen_shapes=QUICK_SHAPES[:1], refine_top=1, top_k=1, max_screen=2,
                  repeats=1, warmup=0, interpret=True)


def _args() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.gemm_sweep",
                                description=__doc__.split("\n")[0])
    p.add_argument("--out", help="results folder (default: $OUT, else a temporary folder)")
    p.add_argument("--budget-s", type=float, default=420.0, help="wall-clock budget, seconds")
    p.add_argument("--shapes", type=parse_mkn, help="comma-separated MxKxN (default: presets)")
    p.add_argument("--quick", action="store_true",
                   help="CPU check of the code path: interpreter, tiny shapes, two configs")
    p.add_argument("--screen-all", action="store_true",
                   help="screen and refine every listed shape (default: the screen shapes only)")
    p.add_argument("--around-table", action="store_true",
                   help="each shape's table config and its wgmma-in-flight variants, no screen")
    p.add_argument("--pingpong", action="store_true",
                   help="each shape's table config and pingpong-warpgroup configs, no screen")
    p.add_argument("--no-cluster", action="store_true",
                   help="leave 2-CTA clusters out of the screen (should one hang the GPU)")
    p.add_argument("--write-table", metavar="RESULTS_JSON", nargs="+", type=Path,
                   help="turn sweeps' JSON (later runs override a shape) into "
                        "pallas_kernels/gemm_configs.py and exit")
    p.add_argument("--table-out", default=str(TABLE_PATH), help="where --write-table writes")
    p.add_argument("--unmeasured", action="store_true",
                   help="print the listed shapes (default: presets) the table has no entry for, "
                        "as --shapes takes them, and exit")
    return p


def unmeasured(shapes: Sequence[Shape]) -> list[Shape]:
    """The shapes without an entry of their own in pallas_kernels/gemm_configs.py: they run a
    config measured at the nearest shape (or the modelled pick), never checked at theirs."""
    from pallas_kernels import gemm_configs

    measured = {tuple(shape) for shape, _ in gemm_configs.ENTRIES}
    return [s for s in shapes if tuple(s) not in measured]


def main(argv: Sequence[str] | None = None) -> int:
    args = _args().parse_args(argv)
    if args.write_table:
        from bench import gemm_table_writer

        print(gemm_table_writer.write_table(args.write_table, Path(args.table_out)))
        return 0
    if args.unmeasured:
        print(",".join("x".join(map(str, s)) for s in unmeasured(args.shapes or SHAPES)))
        return 0
    if args.quick:
        from pallas_kernels.interpreter_flags import use_interpreter_safe_xla_flags

        use_interpreter_safe_xla_flags()  # before the first computation
    out = Path(args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="gemm_sweep_"))
    out.mkdir(parents=True, exist_ok=True)
    shapes = args.shapes or (QUICK_SHAPES if args.quick else SHAPES)
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    device = jax.devices()[0]
    meta = dict(command=f"python -m bench.gemm_sweep {argv_text}".strip(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                commit=_commit(), device=device.device_kind, platform=device.platform,
                sms=getattr(device, "core_count", None), jax=jax.__version__,
                budget_s=args.budget_s, quick=args.quick, rel_tol=REL_TOL)
    plan = dataclasses.replace(QUICK_PLAN if args.quick else Plan(), clusters=not args.no_cluster,
                               around_table=args.around_table, screen_all=args.screen_all,
                               pingpong=args.pingpong)
    Sweep(out=out, budget_s=args.budget_s, plan=plan, meta=meta, shapes=shapes).run()
    print(out / JSON_NAME)
    print(out / MD_NAME)
    return 0


def _commit() -> str | None:
    """The checkout's commit where git and .git are there (the GPU's copy may lack .git)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _xla_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    return x @ w


def _ours(x: jax.Array, w: jax.Array, *, config: TuningConfig, interpret: bool) -> jax.Array:
    return plain_matmul(x, w, config=config, interpret=interpret)


def _inputs(shape: Shape, copies: int) -> list[tuple[jax.Array, jax.Array]]:
    """Fresh random x and w (normal, w scaled by 1/sqrt(K)) per copy, drawn on the device."""
    m, k, n = shape
    sets = []
    for i in range(copies):
        kx, kw = jax.random.split(jax.random.key(hash(shape) % 2**31 + i))
        x = jax.random.normal(kx, (m, k), jnp.bfloat16)
        w = (jax.random.normal(kw, (k, n), jnp.float32) / math.sqrt(k)).astype(jnp.bfloat16)
        sets.append((x, w))
    return sets


def _rel_error(y: jax.Array, ref: jax.Array) -> float:
    diff = y.astype(jnp.float32) - ref.astype(jnp.float32)
    return float(jnp.linalg.norm(diff) / jnp.linalg.norm(ref.astype(jnp.float32)))


@dataclasses.dataclass
class Sweep:
    """One sweep: its rows (one per shape, JSON-ready), the budget, the running cost of a config."""

    out: Path
    budget_s: float
    plan: Plan
    meta: dict[str, Any]
    shapes: Sequence[Shape]
    start: float = dataclasses.field(default_factory=time.monotonic)
    costs: list[float] = dataclasses.field(default_factory=list)
    configs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    rows: dict[Shape, dict[str, Any]] = dataclasses.field(default_factory=dict)
    stopped: bool = False

    def run(self) -> None:
        for m, k, n in self.shapes:
            self.rows[(m, k, n)] = dict(shape=[m, k, n], status="untimed",
                                        default=candidates.name(default_config(m, k, (n,))),
                                        cublas_samples_us=[], results={})
        if self.plan.around_table or self.plan.pingpong:
            variants = (candidates.pingpong_variants if self.plan.pingpong
                        else candidates.in_flight_variants)
            for m, k, n in self.shapes:
                self.visit((m, k, n), variants(default_config(m, k, (n,))))
            self.write()
            return
        screen = ([s for s in self.shapes if self.plan.screen_all or s in self.plan.screen_shapes]
                  or list(self.shapes[:1]))
        screen_list = candidates.screen(self.plan.clusters)[: self.plan.max_screen]
        for shape in screen:
            self.visit(shape, screen_list)
        refined = [c for top in self.ranking(screen)[: self.plan.refine_top]
                   for c in candidates.refinements(top)]
        for shape in screen:
            self.visit(shape, refined)
        top = self.ranking(screen)[: self.plan.top_k]
        self.meta["carried_configs"] = [candidates.name(c) for c in top]
        for shape in self.shapes:
            if shape not in screen:
                self.visit(shape, top)
        self.write()

    def ranking(self, shapes: Sequence[Shape]) -> list[TuningConfig]:
        """Configs timed at every one of `shapes`, by geometric mean of time / cuBLAS."""
        scores = {}
        for config_name in self.configs:
            ratios = [self.rows[s]["results"].get(config_name, {}).get("ratio") for s in shapes]
            if all(r is not None for r in ratios):
                scores[config_name] = statistics.geometric_mean(ratios)
        return [self._config(n) for n in sorted(scores, key=scores.get)]

    def _config(self, config_name: str) -> TuningConfig:
        return config_from_fields(self.configs[config_name])

    def over_budget(self) -> bool:
        estimate = statistics.mean(self.costs[-8:]) if self.costs else FIRST_COST_S
        return time.monotonic() - self.start + estimate > self.budget_s

    def visit(self, shape: Shape, configs: Sequence[TuningConfig]) -> None:
        """Time `shape`'s default config and `configs` not yet timed there, cuBLAS between."""
        row = self.rows[shape]
        m, k, n = shape
        todo = {candidates.name(c): c for c in [default_config(m, k, (n,)), *configs]}
        todo = {name: c for name, c in todo.items() if name not in row["results"]}
        if self.stopped or not todo:
            return
        if self.over_budget():
            self._stop()
            return
        first = _inputs(shape, 1)[0]
        copies = 1 if self.plan.interpret else timing.rotation_copies(
            sum(a.nbytes for a in first))
        arg_sets = [first, *_inputs(shape, copies)[1:]]
        ref = jax.jit(_xla_matmul)(*first)
        self._time_cublas(row, arg_sets)
        for i, (config_name, config) in enumerate(todo.items()):
            if self.over_budget():
                self._stop()
                break
            began = time.monotonic()
            self.configs[config_name] = config_fields(config)
            # A kernel that hangs the GPU ends the process: the JSON names it ("running").
            row["running"] = config_name
            self.write()
            faulthandler.dump_traceback_later(CONFIG_TIMEOUT_S, exit=True)
            row["results"][config_name] = result = self._try(config, arg_sets, ref)
            faulthandler.cancel_dump_traceback_later()
            del row["running"]
            self.costs.append(time.monotonic() - began)
            print(f"{'x'.join(map(str, shape))} {config_name}: {result['status']} "
                  f"{result.get('us', '')}", flush=True)
            if (i + 1) % CUBLAS_EVERY == 0:
                self._time_cublas(row, arg_sets)
        else:
            self._time_cublas(row, arg_sets)
        self._summarize(row, complete=not self.stopped)
        self.write()

    def _stop(self) -> None:
        self.stopped = True
        self.meta["stopped_at_s"] = round(time.monotonic() - self.start, 1)

    def _time_cublas(self, row: dict[str, Any], arg_sets) -> None:
        t = timing.measure(_xla_matmul, arg_sets, repeats=self.plan.repeats,
                           warmup=self.plan.warmup)
        row["cublas_samples_us"].append(round(t.best_us, 2))
        row["cublas_us"] = round(statistics.median(row["cublas_samples_us"]), 2)
        row["cupti_error"] = t.cupti_error
        _ratios(row)

    def _try(self, config: TuningConfig, arg_sets, ref: jax.Array) -> dict[str, Any]:
        """Check `config` once against XLA's output, then time it; or say why not."""
        x, w = arg_sets[0]
        fn = functools.partial(_ours, config=config, interpret=self.plan.interpret)
        try:
            check_shapes(x, [w], config)
            y = jax.block_until_ready(jax.jit(fn)(x, w))
        except Unsupported as err:
            return dict(status="unsupported", reason=str(err))
        except Exception as err:  # a config Mosaic cannot build (e.g. SMEM): skip it, say why
            reason = f"{type(err).__name__}: {err}"[:400]
            return dict(status="smem" if "shared memory" in reason else "error", reason=reason)
        error = _rel_error(y, ref)
        if not error <= REL_TOL:
            return dict(status="wrong", rel_error=error)
        t = timing.measure(fn, arg_sets, repeats=self.plan.repeats, warmup=self.plan.warmup)
        result = dict(status="ok", us=round(t.best_us, 2), wall_us=round(t.wall_us, 2),
                      rel_error=float(f"{error:.3g}"), cupti_error=t.cupti_error)
        return result

    def _summarize(self, row: dict[str, Any], *, complete: bool) -> None:
        _ratios(row)
        ok = {n: r for n, r in row["results"].items() if r["status"] == "ok"}
        row["status"] = "timed" if complete else ("partial" if ok else "untimed")
        row["default_us"] = ok.get(row["default"], {}).get("us")
        if ok:
            best = min(ok, key=lambda n: ok[n]["us"])
            row.update(best=best, best_us=ok[best]["us"], ratio=ok[best]["ratio"])

    def write(self) -> None:
        """The JSON (everything) and the Markdown table, rewritten whole."""
        doc = dict(meta=self.meta, plan=dataclasses.asdict(self.plan), configs=self.configs,
                   shapes=list(self.rows.values()))
        (self.out / JSON_NAME).write_text(json.dumps(doc, indent=1) + "\n")
        (self.out / MD_NAME).write_text(markdown(doc))


def _ratios(row: dict[str, Any]) -> None:
    for result in row["results"].values():
        if "us" in result:
            result["ratio"] = round(result["us"] / row["cublas_us"], 4)


def markdown(doc: dict[str, Any]) -> str:
    """Shape, cuBLAS, default and best config (us), best config, best / cuBLAS; then failures."""
    meta = doc["meta"]
    lines = [f"# GEMM sweep: {meta['device']}, {meta['date']}, commit {meta['commit']}", "",
             f"`{meta['command']}`; times in us (CUPTI kernel time unless noted), "
             f"cuBLAS = XLA's bf16 `x @ w`.", "",
             "| M x K x N | cuBLAS | default | best | best config | best / cuBLAS | status |",
             "|---|---:|---:|---:|---|---:|---|"]
    failures = []
    for row in doc["shapes"]:
        shape = "x".join(map(str, row["shape"]))
        cells = [row.get("cublas_us"), row.get("default_us"), row.get("best_us")]
        text = ["-" if c is None else f"{c:.1f}" for c in cells]
        ratio = row.get("ratio")
        lines.append(f"| {shape} | {' | '.join(text)} | {row.get('best', '-')} | "
                     f"{'-' if ratio is None else f'{ratio:.3f}'} | {row['status']} |")
        failures += [f"- {shape} {name}: {r['status']} {r.get('reason', r.get('rel_error', ''))}"
                     for name, r in row["results"].items() if r["status"] not in ("ok",)]
    if "carried_configs" in meta:
        lines += ["", "Configs carried past the screen: "
                  + ", ".join(f"`{c}`" for c in meta["carried_configs"])]
    if any(row.get("cupti_error") for row in doc["shapes"]):
        lines += ["", "CUPTI failed for some shapes (wall time used): see the JSON."]
    if failures:
        lines += ["", "Configs not timed:", *failures]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
