"""`python -m verify`: run the properties for every op x dtype and print a table.

    python -m verify [--impl xla|interpret|mosaic] [--examples N] [--seed S] [--ops ...]

Exits 1 if any property fails. Each row: hypothesis examples run, examples a
kernel declined ("unsupported", with the reasons below the table), the worst
error / tolerance seen and the verdict; a failing row prints the shrunk
counterexample below the table.

"worst err/tol" is the largest |output - float64 reference| / tolerance over
every element of every example in the row; the tolerance is verify's error
model for that element (verify/tolerances.py: rounding of the inputs, the
float32 statistics and accumulation, the output dtype), so <= 1 passes and
a value near 1 is an error as large as the model allows, not a near-failure.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, given, seed, settings

import jaxnorm
from pallas_kernels.interpreter_flags import use_interpreter_safe_xla_flags
from verify import checks, identities, rope, strategies


LEGEND = ("worst err/tol: the largest |output - float64 reference| / tolerance (verify's "
          "error model) over the row's\nexamples, <= 1 passes; identity rows: float64 "
          "relative error / 1e-9")


@dataclass
class Row:
    what: str
    dtype: str
    examples: int = 0
    unsupported: int = 0
    worst: float = 0.0
    failure: str = ""
    seconds: float = 0.0
    reasons: set[str] = field(default_factory=set)


def _run_property(row: Row, strategy, check: Callable[[dict], float], examples: int,
                  seed_value: int) -> Row:
    start = time.perf_counter()

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def prop(inputs):
        try:
            ratio = check(inputs)
        except jaxnorm.Unsupported as reason:  # a kernel declined this shape: counted, not passed
            row.unsupported += 1
            row.reasons.add(str(reason))
            return
        row.examples += 1
        row.worst = max(row.worst, ratio)

    try:
        prop()
    except Exception as err:  # the report shows the shrunk counterexample
        row.failure = f"{type(err).__name__}: {err}"
    row.seconds = time.perf_counter() - start
    return row


def _identity_rows(examples: int, seed_value: int) -> list[Row]:
    from hypothesis import strategies as st

    def arrays(rng, *shape):
        return rng.standard_normal(shape)

    def run(name: str, fn: Callable[[np.random.Generator], float]) -> Row:
        # Identities hold to float64 rounding: relative 1e-9 leaves room for sqrt(K) growth.
        return _run_property(Row(f"identity: {name}", "float64"), st.integers(0, 2**32 - 1),
                             lambda s: fn(np.random.default_rng(s)) / 1e-9, examples,
                             seed_value)

    return [
        run("lazy RMSNorm", lambda r: identities.lazy_rms(
            arrays(r, 4, 37), arrays(r, 37), arrays(r, 37, 5), 1e-6)),
        run("lazy LayerNorm", lambda r: identities.lazy_layer_norm(
            arrays(r, 4, 37), arrays(r, 37), arrays(r, 37), arrays(r, 37, 5), arrays(r, 5), 1e-6)),
        run("centering", lambda r: identities.centering(arrays(r, 3, 9), arrays(r, 9, 4))),
        run("variance from moments", lambda r: identities.variance_from_moments(arrays(r, 3, 9))),
        run("chunked statistics", lambda r: identities.chunked_statistics(arrays(r, 3, 50), 4)),
        run("shifted statistics", lambda r: identities.shifted_statistics(
            arrays(r, 3, 64) + r.uniform(-1e3, 1e3), 8, "first")),
        run("Chan (sum, M2) statistics", lambda r: identities.chan_statistics(
            arrays(r, 3, 64) + r.uniform(-1e3, 1e3), 8)),
        run("r + RMSNorm(x W) from partials", lambda r: identities.residual_after_statistics(
            arrays(r, 3, 16), arrays(r, 16, 64), arrays(r, 3, 64) + r.uniform(-1e3, 1e3),
            arrays(r, 64), 1e-6, 8)),
        run("norms from (mean, M2)", lambda r: identities.norms_from_mean_m2(
            arrays(r, 3, 40) + r.uniform(-10, 10), 1e-6)),
        run("deferred scale", lambda r: identities.deferred_scale(
            arrays(r, 3, 40), arrays(r, 40, 6), 1e-6, 16)),
        run("norm cancellation", lambda r: identities.norm_cancellation(
            arrays(r, 3, 12), float(r.uniform(0.01, 100.0)), arrays(r, 12, 7))),
        run("QK-norm scores", lambda r: identities.qk_norm_scores(
            arrays(r, 5, 16), arrays(r, 6, 16), arrays(r, 16), arrays(r, 16), 1e-6)),
        run("RMSNorm backward in one pass", lambda r: identities.rms_backward_one_pass(
            arrays(r, 6, 24), arrays(r, 24), arrays(r, 6, 24), 1e-6, 4)),
        run("RMSNorm backward of its copies", lambda r: identities.rms_backward_of_copies(
            arrays(r, 6, 24), arrays(r, 24), [arrays(r, 6, 24) for _ in range(3)], 1e-6, 4)),
        run("RoPE keeps the row scale", lambda r: identities.rope_norm(
            arrays(r, 5, 16), r.uniform(0.0, 4096.0, 5), arrays(r, 16), 1e-6)),
        run("RoPE keeps head norms", lambda r: rope.rope_keeps_head_norms(
            arrays(r, 5, 3 * 16), r.uniform(0.0, 4096.0, 5), 16)),
        run("RoPE(s q) = s RoPE(q)", lambda r: rope.rope_commutes_with_row_scale(
            arrays(r, 5, 3 * 16), r.uniform(0.01, 100.0, 5), r.uniform(0.0, 4096.0, 5), 16)),
        run("QKNorm(s q) = QKNorm(q)", lambda r: rope.qk_norm_ignores_row_scale(
            arrays(r, 5, 3 * 16), r.uniform(0.01, 100.0, 5), arrays(r, 16), 16)),
    ]


def _op_rows(ops: list[str], impl: str, examples: int, seed_value: int,
             max_k: int) -> list[Row]:
    rows = []
    for op in ops:
        for dtype in strategies.impl_dtypes(impl):
            rows.append(_run_property(
                Row(op, str(dtype)), strategies.impl_inputs(op, impl, dtype, max_k),
                lambda inputs, op=op: checks.check_op(op, impl, **inputs), examples,
                seed_value))
        grad_dtype = strategies.impl_dtypes(impl)[0]
        rows.append(_run_property(
            Row(f"grad {op}", str(np.dtype(grad_dtype))),
            strategies.impl_inputs(op, impl, grad_dtype, min(max_k, 1024)),
            lambda inputs, op=op: checks.check_grad(op, impl, **inputs), examples, seed_value))
    return rows


def _print_table(rows: list[Row], impl: str) -> None:
    print(f"\njaxnorm verify report (impl={impl})")
    header = (f"{'property':<34} {'dtype':<9} {'examples':>8} {'unsupported':>11} "
              f"{'worst err/tol':>14} {'time':>7}  verdict")
    print(header)
    print("-" * len(header))
    for r in rows:
        verdict = "FAIL" if r.failure else ("pass" if r.examples else "NOT RUN")
        print(f"{r.what:<34} {r.dtype:<9} {r.examples:>8} {r.unsupported:>11} "
              f"{r.worst:>14.3g} {r.seconds:>6.1f}s  {verdict}")
    print(f"{LEGEND}\n")
    for r in rows:
        if r.failure:
            print(f"\nFAIL {r.what} [{r.dtype}]:\n{r.failure}")
        for reason in sorted(r.reasons)[:3]:
            print(f"unsupported {r.what} [{r.dtype}]: {reason}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verify", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", default="xla", choices=["xla", "interpret", "mosaic"],
                        help="implementation to judge: xla (pure JAX, any device), interpret "
                             "(the Mosaic kernels under the Pallas GPU interpreter, CPU) or "
                             "mosaic (the kernels on a Hopper GPU) (default: xla)")
    parser.add_argument("--examples", type=int, default=25,
                        help="hypothesis examples per row (default: 25)")
    parser.add_argument("--seed", type=int, default=0,
                        help="hypothesis seed; the same seed draws the same inputs (default: 0)")
    parser.add_argument("--ops", nargs="+", default=list(checks.OPS), choices=checks.OPS,
                        metavar="OP",
                        help=f"ops to check (default: all of {', '.join(checks.OPS)})")
    parser.add_argument("--max-k", type=int, default=8192,
                        help="largest hidden size drawn (interpret mode is slow: use 256)")
    parser.add_argument("--no-identities", action="store_true",
                        help="skip the float64 algebraic identities (verify/identities.py) and "
                             "check only the ops")
    args = parser.parse_args(argv)
    if args.impl == "interpret":
        use_interpreter_safe_xla_flags()
    rows = [] if args.no_identities else _identity_rows(args.examples, args.seed)
    for row in rows:
        print(f"  {row.what}: {row.examples} examples", file=sys.stderr)
    rows += _op_rows(args.ops, args.impl, args.examples, args.seed, args.max_k)
    _print_table(rows, args.impl)
    return 1 if any(r.failure or not r.examples for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
