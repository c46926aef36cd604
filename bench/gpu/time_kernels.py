"""Each Mosaic kernel at its automatic pick against XLA's stock path, timed with bench/timing.py.

    PYTHONPATH=. python bench/gpu/time_kernels.py             # H200; JSON under $OUT
    SMOKE=1 PYTHONPATH=. python bench/gpu/time_kernels.py     # CPU: small sizes, wall time

One row per (op, shape): CUPTI kernel time (wall time where CUPTI is unavailable) of
impl="mosaic" and of impl="xla", inputs rotated through copies larger than L2
(`bench.timing.rotation_copies`). Correctness is bench/gpu/check_kernels.py's job.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

SMOKE = os.environ.get("SMOKE") == "1"
if SMOKE:
    from pallas_kernels.interpreter_flags import use_interpreter_safe_xla_flags

    use_interpreter_safe_xla_flags()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxnorm  # noqa: E402
from bench import timing  # noqa: E402

BF16 = jnp.bfloat16
KERNEL_IMPL = "interpret" if SMOKE else "mosaic"

# (op, (M, K, N) on the GPU, (M, K, N) under SMOKE): the shapes the picks were measured at.
CASES = [
    ("rms_norm", (8192, 4096, 0), (64, 512, 0)),
    ("layer_norm", (8192, 8192, 0), (64, 512, 0)),
    ("rms_norm_dense", (8192, 4096, 14336), (128, 128, 256)),
    ("rms_norm_dense", (2048, 4096, 6144), (64, 128, 128)),
    ("layer_norm_dense", (8192, 4096, 4096), (128, 128, 256)),
    ("dense_rms_norm", (8192, 4096, 2048), (128, 128, 256)),
    ("dense_rms_norm", (8192, 4096, 4096), (128, 128, 512)),
    ("dense_layer_norm", (8192, 4096, 2048), (128, 128, 256)),
]


def _call(op: str, impl: str):
    """fn(*args) of `op` under `impl`, with the args it takes."""
    if op == "rms_norm":
        return lambda x, g: jaxnorm.rms_norm(x, g, impl=impl)
    if op == "layer_norm":
        return lambda x, g: jaxnorm.layer_norm(x, g, g, impl=impl)
    if op == "rms_norm_dense":
        return lambda x, g, w: jaxnorm.rms_norm_dense(x, g, w, impl=impl)
    if op == "layer_norm_dense":
        return lambda x, g, w: jaxnorm.layer_norm_dense(x, g, g, w, impl=impl)
    if op == "dense_rms_norm":
        return lambda x, g, w: jaxnorm.dense_rms_norm(x, w, g, g, impl=impl)
    return lambda x, g, w: jaxnorm.dense_layer_norm(x, w, g, g, g, impl=impl)


def _args(rng: np.random.Generator, op: str, m: int, k: int, n: int) -> tuple[jax.Array, ...]:
    x = jnp.asarray(rng.standard_normal((m, k)), BF16)
    if op in ("rms_norm", "layer_norm"):
        return x, jnp.asarray(1 + 0.2 * rng.standard_normal(k), jnp.float32)
    w = jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), BF16)
    width = k if op.endswith("_dense") else n
    return x, jnp.asarray(1 + 0.2 * rng.standard_normal(width), jnp.float32), w


def main() -> int:
    out = os.environ.get("OUT") or tempfile.mkdtemp(prefix="time_kernels_")
    os.makedirs(out, exist_ok=True)
    repeats = 3 if SMOKE else 30
    rows = []
    for op, full, smoke in CASES:
        m, k, n = smoke if SMOKE else full
        rng = np.random.default_rng(m + k + n)
        first = _args(rng, op, m, k, n)
        copies = 1 if SMOKE else timing.rotation_copies(sum(a.nbytes for a in first))
        arg_sets = [first] + [_args(rng, op, m, k, n) for _ in range(copies - 1)]
        row = dict(op=op, shape=[m, k, n])
        for impl in (KERNEL_IMPL, "xla"):
            t = timing.measure(_call(op, impl), arg_sets, repeats=repeats, warmup=1)
            row[impl] = dict(us=round(t.best_us, 2), kernel_us=t.kernel_us,
                             cupti_error=t.cupti_error)
        row["ratio"] = round(row[KERNEL_IMPL]["us"] / row["xla"]["us"], 3)
        print(f"{op:18} {m}x{k}x{n}: {KERNEL_IMPL} {row[KERNEL_IMPL]['us']:9.1f} us, "
              f"xla {row['xla']['us']:9.1f} us ({row['ratio']}x)", flush=True)
        rows.append(row)
    device = jax.devices()[0]
    path = os.path.join(out, "time_kernels.json")
    with open(path, "w") as f:
        json.dump(dict(device=device.device_kind, jax=jax.__version__, smoke=SMOKE, rows=rows),
                  f, indent=1)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
