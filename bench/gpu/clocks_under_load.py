"""SM clock and power while the post-norm kernel and our plain GEMM run back to back (H200).

Question it answers: is the GEMM power-bound, so that time the tensor cores
spend idle in an epilogue is partly won back as clock? If the plain GEMM runs
below the boost clock while the post-norm kernel runs at a higher one, hiding
the epilogue cannot buy its whole length. (The 2026-11-30 run also timed a
ping-pong schedule, since removed: bench/results/h200-2026-11-30/post_norm_clocks.)

Each workload is launched back to back for LOAD_S seconds while `nvidia-smi`
samples clocks.sm, power.draw and the active throttle reasons every 50 ms; the
samples of the last 2/3 of each window are summarized (median). Steady-state
time per call is the window's wall time over its calls. Reads only; it changes
no setting of the card.

    PYTHONPATH=. OUT=/tmp python3 bench/gpu/clocks_under_load.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

OUT = os.environ.get("OUT", "/tmp")
LOAD_S = float(os.environ.get("LOAD_S", "4"))
BF16 = jnp.bfloat16
QUERY = "timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active"


def _workloads(m: int, k: int, n: int) -> dict:
    from pallas_kernels import plain_matmul
    from pallas_kernels import post_norm_matmul as pn

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, k)), BF16)
    w = jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), BF16)
    b = jnp.asarray(rng.standard_normal(n), jnp.float32)
    g = jnp.asarray(1 + 0.2 * rng.standard_normal(n), jnp.float32)
    config = pn.select_gpu_config(m, k, n, BF16, kind="rms")

    post = jax.jit(lambda x: pn.post_norm_matmul(x, w, b, g, None, None, kind="rms", eps=1e-6,
                                                 config=config, pre_norm_sum=False)[0])
    return {"plain": (jax.jit(lambda x: plain_matmul.plain_matmul(x, w)), x), "post": (post, x)}


def _load(fn, x) -> tuple[float, float, float, int]:
    fn(x).block_until_ready()
    t0 = time.time()
    calls = 0
    while time.time() - t0 < LOAD_S:
        for _ in range(50):
            out = fn(x)
        out.block_until_ready()
        calls += 50
    t1 = time.time()
    return t0, t1, (t1 - t0) / calls * 1e6, calls


def main() -> None:
    log = os.path.join(OUT, "clocks.csv")
    sampler = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader",
                                "-lms", "50"], stdout=open(log, "w"), stderr=subprocess.STDOUT)
    windows = []
    try:
        time.sleep(1.0)
        windows.append(("idle", time.time() - 1.0, time.time(), None, 0))
        for m, k, n in ((8192, 4096, 2048), (8192, 4096, 4096)):
            for name, (fn, x) in _workloads(m, k, n).items():
                t0, t1, us, calls = _load(fn, x)
                windows.append((f"{name} {m}x{k}x{n}", t0, t1, us, calls))
                print(f"{name} {m}x{k}x{n}: {us:.1f} us/call over {calls} calls", flush=True)
    finally:
        time.sleep(0.2)
        sampler.terminate()
        sampler.wait()
    samples = []
    for line in open(log):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            stamp = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            stamp += float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
            samples.append((stamp, float(parts[1].split()[0]), float(parts[2].split()[0]),
                            parts[3]))
        except (ValueError, IndexError):
            continue
    results = []
    for name, t0, t1, us, calls in windows:
        start = t0 + (t1 - t0) / 3
        inside = [s for s in samples if start <= s[0] <= t1]
        item = dict(name=name, us_per_call=us, calls=calls, samples=len(inside))
        if inside:
            item["sm_mhz"] = statistics.median(s[1] for s in inside)
            item["power_w"] = statistics.median(s[2] for s in inside)
            item["throttle"] = sorted({s[3] for s in inside})
        results.append(item)
        print(json.dumps(item), flush=True)
    with open(os.path.join(OUT, "clocks.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
