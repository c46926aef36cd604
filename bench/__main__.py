"""`python -m bench --suite ledger|model|norm-gemm|post-norm|norms|decode-step|train-step|...`.

GPU suites also: residual-gemm (bench/residual_gemm.py).

The ledger suite predicts (CPU, instant); `model` measures whole models,
stock Flax against jaxnorm (bench/model_suite.py; `--quick` runs tiny shapes
on any backend); the others measure single ops on an H200. All write JSON,
Markdown and plots into --out. Without a GPU the op suites stop with a
message and exit status 2.

--out defaults to bench-out/ in the working directory (ignored by git), so a
run never overwrites the published record; `--out bench/results/<name>`
publishes one (see bench/results/README.md for what a published folder holds).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

from bench import ledger, ledger_view, report, shapes
from bench.presets import PRESETS, ModelPreset

LEDGER = "ledger"
MODEL = "model"
GPU_SUITES = ("norm-gemm", "post-norm", "norms", "decode-step", "train-step", "residual-gemm")
DEFAULT_OUT = Path("bench-out")

T = TypeVar("T")


def _list_of(
    kind: Callable[[str], T], choices: tuple[str, ...] | None = None
) -> Callable[[str], tuple[T, ...]]:
    """An argparse type for comma-separated values, checked against `choices`."""

    def parse(text: str) -> tuple[T, ...]:
        items = tuple(item.strip() for item in text.split(",") if item.strip())
        if choices is not None:
            unknown = [item for item in items if item not in choices]
            if unknown:
                raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {list(choices)}")
        return tuple(kind(item) for item in items)

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--suite",
        type=_list_of(str, (LEDGER, MODEL, *GPU_SUITES)),
        default=(LEDGER,),
        help="comma-separated suites: ledger (CPU, predicted traffic and time), model (whole "
        "models, stock Flax vs jaxnorm; --quick runs anywhere) or GPU suites "
        f"{', '.join(GPU_SUITES)} (measured on an H200) (default: ledger)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"results directory (default: {DEFAULT_OUT}/, outside the tracked tree; "
        "--out bench/results/<name> to publish)",
    )
    gpu = parser.add_argument_group("GPU suites")
    gpu.add_argument("--quick", action="store_true", help="a small subset of each suite's shapes")
    gpu.add_argument("--m", type=_list_of(int), help="only these M (rows), e.g. 16,8192")
    gpu.add_argument(
        "--kn",
        type=_list_of(str),
        help='only these "KxN" (N = total width, e.g. 4096x28672), or "K" for norms',
    )
    gpu.add_argument("--impl", type=_list_of(str),
                     help="only these implementations, e.g. xla,jaxnorm (bench/impls.py lists "
                          "them; default: all that serve the suite)")
    gpu.add_argument("--norm", type=_list_of(str, ("rms", "layer")),
                     help="only these norms: rms and/or layer (default: both)")
    gpu.add_argument(
        "--preset",
        type=_list_of(str, tuple(PRESETS)),
        help="presets for decode-step (default: all but tiny) and ledger (default: all)",
    )
    gpu.add_argument("--repeats", type=int, default=30,
                     help="timed calls per row; the median is reported (default: 30)")
    gpu.add_argument("--warmup", type=int, default=3,
                     help="untimed calls after compiling (default: 3)")
    model = parser.add_argument_group("model suite")
    model.add_argument(
        "--model",
        type=_list_of(str, tuple(_model_shapes())),
        help=f"model shapes (default: all of {', '.join(_model_shapes())})",
    )
    model.add_argument("--phase", type=_list_of(str, ("prefill", "train", "decode")),
                       default=("prefill", "train", "decode"),
                       help="phases to measure (default: prefill,train,decode)")
    model.add_argument("--decode-batch", type=_list_of(int),
                       help="decode batch sizes (default: each shape's, 1,8,64)")
    model.add_argument("--decode-steps", type=int,
                       help="greedy steps per timed decode call (default 8); the call copies "
                            "the cache once, so more steps weigh that copy less")
    model.add_argument("--rounds", type=int, default=2,
                       help="rounds of the interleaved variants (default: 2)")
    model.add_argument("--variants", type=_list_of(str, _model_variants()),
                       help="variants to measure, stock and jaxnorm among them (default: all "
                            "four, and in decode cells the cache-layout control); fewer "
                            "variants hold fewer caches on the device")
    model.add_argument("--detail", type=Path,
                       help="also write each cell's kernels by name and optimized HLO here")
    model.add_argument("--bounded-limit", action="store_true",
                       help="also measure the norm-free limit with each norm a calibrated "
                            "constant (activations at stock's scale)")
    led = parser.add_argument_group("ledger")
    led.add_argument("--batch", type=_list_of(int), default=(1, 64),
                     help="decode batch sizes (default: 1,64)")
    led.add_argument("--context", type=int, default=4096,
                     help="decode context length L, tokens (default: 4096)")
    led.add_argument("--prefill-m", type=int, default=8192, help="prefill tokens M (default: 8192)")
    led.add_argument("--hbm-bw", type=float,
                     help="HBM bandwidth in bytes/s the roofline divides by (default: the "
                          "H200 figure in bench/ledger.py's Ceilings)")
    led.add_argument("--gemm-flops", type=float,
                     help="bf16 GEMM rate in FLOP/s the roofline divides by (default: the "
                          "H200 figure in bench/ledger.py's Ceilings)")
    return parser.parse_args(argv)


def _model_shapes() -> tuple[str, ...]:
    from bench.model_suite import SHAPES  # imports JAX: only when the model suite is named

    return tuple(SHAPES)


def _model_variants() -> tuple[str, ...]:
    from bench.model_suite import BOUNDED, LAYOUT_CONTROL, VARIANTS

    return (*VARIANTS, BOUNDED, LAYOUT_CONTROL)


def run_model_suite(args: argparse.Namespace, console: Console) -> None:
    from bench import model_suite

    shapes = ([model_suite.QUICK] if args.quick else
              [model_suite.SHAPES[name] for name in args.model or model_suite.SHAPES])
    if args.decode_batch:
        shapes = [dataclasses.replace(s, decode_batches=tuple(args.decode_batch)) for s in shapes]
    if args.decode_steps:
        if not 1 <= args.decode_steps < min(s.cache for s in shapes):
            raise SystemExit(f"--decode-steps must lie in [1, cache); got {args.decode_steps}")
        shapes = [dataclasses.replace(s, decode_steps=args.decode_steps) for s in shapes]
    try:
        model_suite.selected_variants(args.variants, bounded=args.bounded_limit,
                                      layout_control=True)
    except ValueError as e:
        raise SystemExit(f"--variants: {e}") from None
    model_suite.run(shapes, rounds=args.rounds, repeats=args.repeats, warmup=args.warmup,
                    phases=args.phase, out=args.out, detail=args.detail,
                    bounded=args.bounded_limit, variants=args.variants)
    console.print(f"wrote {args.out}/model-suite.{{json,md,png}}")


def _ledger_json(
    args: argparse.Namespace, ceilings: ledger.Ceilings, presets: list[ModelPreset]
) -> dict[str, Any]:
    """Every number behind the ledger tables, in microseconds and raw counts."""

    def summary(ops: list[ledger.Op]) -> dict[str, Any]:
        cost = ledger.total_cost(ops)
        seconds = ledger.op_seconds(ops, ceilings)
        return {
            "step_us": sum(seconds.values()) * 1e6,
            "kernels": ledger.kernel_count(ops),
            "flops": cost.flops,
            "bytes": cost.moves * ledger.BF16_BYTES,
            "op_us": {name: t * 1e6 for name, t in seconds.items()},
        }

    return {
        "ceilings": dataclasses.asdict(ceilings),
        "context": args.context,
        "prefill_tokens": args.prefill_m,
        "presets": {
            p.name: {
                "preset": dataclasses.asdict(p),
                "decode": {
                    f"B={b} {'fused' if fused else 'unfused'}": summary(
                        ledger.decode_step(p, b, args.context, fused=fused)
                    )
                    for b in args.batch
                    for fused in (False, True)
                },
                "prefill_layer": {
                    "fused" if fused else "unfused": summary(
                        ledger.prefill_layer(p, args.prefill_m, fused=fused)
                    )
                    for fused in (False, True)
                },
            }
            for p in presets
        },
    }


def run_ledger(args: argparse.Namespace, console: Console) -> None:
    """Print the predictions and write them as ledger.md and ledger.json."""
    overridden = args.hbm_bw is not None or args.gemm_flops is not None
    defaults = ledger.Ceilings()
    ceilings = ledger.Ceilings(
        hbm_bytes_per_s=args.hbm_bw or defaults.hbm_bytes_per_s,
        gemm_flops_per_s=args.gemm_flops or defaults.gemm_flops_per_s,
        source="passed on the command line" if overridden else defaults.source,
    )
    names = args.preset or tuple(PRESETS)
    presets = [PRESETS[name] for name in names]
    batches = list(args.batch)
    tables = [ledger_view.decode_op_table(p, batches, args.context, ceilings) for p in presets]
    tables += [
        ledger_view.decode_summary(presets, batches, args.context, ceilings),
        ledger_view.prefill_table(presets, args.prefill_m, ceilings),
        ledger_view.norm_gemm_table(shapes.M_ALL, shapes.NORM_GEMM_KNS, ceilings),
    ]
    preamble = [
        f"Roofline ceilings: HBM {ceilings.hbm_bytes_per_s / 1e12:.2f} TB/s, bf16 GEMM "
        f"{ceilings.gemm_flops_per_s / 1e12:.0f} TFLOP/s ({ceilings.source}).",
        "Conventions and formulas: bench/ledger.py. Launch latency is not in the roofline.",
    ]
    lines = ledger_view.headlines(presets, batches, args.context, args.prefill_m, ceilings)
    report.print_tables(tables, console)
    for line in [*preamble, "", "Headlines:", *lines]:
        console.print(line, highlight=False)
    args.out.mkdir(parents=True, exist_ok=True)
    bullets = [f"- {line}" for line in lines]
    report.write_markdown(
        args.out / "ledger.md", "Ledger: roofline predictions", [*preamble, "", *bullets], tables
    )
    report.write_json(args.out / "ledger.json", _ledger_json(args, ceilings, presets))
    console.print(f"wrote {args.out / 'ledger.md'} and {args.out / 'ledger.json'}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 200)
    if LEDGER in args.suite:
        run_ledger(args, console)
    if MODEL in args.suite:
        run_model_suite(args, console)
    gpu_suites = [s for s in args.suite if s not in (LEDGER, MODEL)]
    if not gpu_suites:
        return 0
    from bench import suites  # imports JAX: only for the GPU suites

    options = suites.Options(
        quick=args.quick,
        ms=args.m,
        kns=args.kn,
        impls=args.impl,
        norms=args.norm,
        presets=args.preset,
        repeats=args.repeats,
        warmup=args.warmup,
    )
    try:
        suites.run(gpu_suites, options, args.out, console, vars(args))
    except suites.NoGPU as err:
        Console(stderr=True).print(
            f"[red]bench: the GPU suites ({', '.join(gpu_suites)}) need an NVIDIA Hopper GPU: "
            f"{err}.[/red]\nRun them on the GPU machine; "
            "`python -m bench --suite ledger` works here."
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
