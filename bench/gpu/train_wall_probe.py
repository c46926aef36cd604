"""Where a training step's wall time goes: the model suite's Qwen3-0.6B training cell with
one more variant, jaxnorm with every kernel declined (stock's graph through jaxnorm's
layers), and each variant's sorted wall samples beside its CUPTI kernel time and the
norm-free limit's.

Run it twice, once with `XLA_FLAGS=--xla_gpu_enable_command_buffer=`, to see whether
the difference lies in how XLA replays the step (command buffers split at custom calls)
rather than in the kernels. Usage: python bench/gpu/train_wall_probe.py [--model NAME]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator

from bench import model_suite, timing
from jaxnorm import dispatch


@contextlib.contextmanager
def kernels_declined() -> Iterator[None]:
    """Automatic dispatch answers xla for every op traced inside (as on a non-Hopper GPU)."""
    original = dispatch.hopper_or_newer
    dispatch.hopper_or_newer = lambda: False
    try:
        yield
    finally:
        dispatch.hopper_or_newer = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-0.6b", choices=(*model_suite.SHAPES, "tiny"))
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out")
    args = parser.parse_args()
    shape = model_suite.QUICK if args.model == "tiny" else model_suite.SHAPES[args.model]
    variants = model_suite.build_variants(shape)
    plan = [("stock", "stock", False), ("jaxnorm", "jaxnorm", False),
            ("jaxnorm, kernels declined", "jaxnorm", True), ("flashified", "flashified", False),
            ("norm-free", "norm-free", False)]
    fns = {label: model_suite.train_case(variants[v], shape, 1)[0] for label, v, _ in plan}
    rows = []
    for r in range(args.rounds):
        for label, v, declined in plan:
            _, arg_sets = model_suite.train_case(variants[v], shape, 1)
            with kernels_declined() if declined else contextlib.nullcontext():
                t = timing.measure(fns[label], arg_sets, repeats=args.repeats, warmup=3)
            walls = sorted(round(w) for w in t.wall_samples_us)
            row = {"round": r + 1, "variant": label, "wall_us": round(t.wall_us),
                   "kernel_us": t.kernel_us and round(t.kernel_us),
                   "kernels": len(t.kernels), "first_call_s": round(t.first_call_s, 1),
                   "wall_samples_us": walls,
                   "xla_flags": os.environ.get("XLA_FLAGS", "")}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del arg_sets
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
