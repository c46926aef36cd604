"""H200 check and timing of the multi-block norms (issue 6); run on the device machine.

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 tests/gpu_norms/run_norms_gpu.py

Sections, each in its own process with a time limit (so that a hung kernel
costs its section, not the run):

1. rows:  impl="mosaic" rms_norm / layer_norm against float64 references with
   verify's tolerance model (one CTA per row block, rows split over clusters
   of 2-8 CTAs through DSMEM, |mean| / std = 1e4 rows), and the global-scratch
   transport against DSMEM on the same inputs (must agree bitwise).
2. post:  dense_rms_norm / dense_layer_norm (+ residual) likewise, clusters of
   1-8 CTAs, and the global transport.
3. norm_time: CUPTI kernel time (sum of the kernels of one call, median of 5
   iterations over rotating input copies that exceed the 60 MB L2 where the
   shape allows) of our kernel (heuristic config), XLA's norm, and an XLA
   elementwise copy (the bandwidth ceiling: read + write of the same bytes).
4. post_time: post-norm kernel vs this package's xla path (dot + norm, which
   also returns the float32 pre-norm sum), XLA's dot alone, our plain GEMM and
   the stock bf16 norm(x @ w + b), with and without a residual (the kernel
   writes h only with one, as the ops do outside autodiff).
5. norm_sweep / post_sweep: other (block_m, cluster) choices; for the post-norm
   kernel pipeline depth, output pieces and the cost of writing h, to check
   the heuristics.
6. post_semaphore: grid groups bitwise against the global transport and
   against float64;
   post_anatomy: a group kernel's time with parts of its exchange removed
   (diagnostic: outputs then wrong and unchecked); post_kernels: the kernels
   one call launches, each with its CUPTI time.

ONLY=post,post_time,post_sweep runs a subset of the sections; a section that
times out (a hung kernel) stops the run. MATCH_post_time=+res runs only that
section's items whose label holds "+res" (MATCH_post_sweep="pick|split" either);
ROUNDS=2 times post_sweep's picks and variants twice, in turn.

Prints a compact table last and writes $OUT/norms_gpu.json (plus the log).
SMOKE=1 runs the same script on a CPU at toy sizes under the Mosaic GPU
interpreter (wall time instead of CUPTI), to check the script before
spending GPU time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

SMOKE = os.environ.get("SMOKE") == "1"
if SMOKE:
    from pallas_kernels.interpreter_flags import use_interpreter_safe_xla_flags

    use_interpreter_safe_xla_flags()
OUT = os.environ.get("OUT", "/tmp")
BF16 = jnp.bfloat16
# Section -> seconds it may take (the whole run must stay under the 300 s call limit).
# Measured on the H200 (first run, 225 s in all): rows 26 s, post 21 s; the
# timing sections ran out of time before their last items.
SECTIONS = {"rows": 35, "post": 60, "norm_time": 85, "post_time": 220, "norm_sweep": 110,
            "post_sweep": 480, "post_semaphore": 60, "post_kernels": 60,
            "post_anatomy": 300}
# ONLY=post,post_time runs a subset (the device allows 600 s per call).
if os.environ.get("ONLY"):
    SECTIONS = {name: SECTIONS[name] for name in os.environ["ONLY"].split(",")}
L2_BYTES = 60 * 2**20


# ------------------------------------------------------------------- helpers


class Section:
    """Results of one section, saved after every item; stops starting items near its limit."""

    def __init__(self, name: str):
        self.name, self.t0 = name, time.time()
        self.limit = SECTIONS[name] - 8  # leave time to save and exit
        self.items: list[dict] = []

    def over_budget(self) -> bool:
        return time.time() - self.t0 > self.limit

    def add(self, item: dict) -> None:
        self.items.append(item)
        print(json.dumps(item), flush=True)
        with open(_section_file(self.name), "w") as f:
            json.dump(self.items, f)

    def run(self, label: str, fn) -> None:
        wanted = os.environ.get(f"MATCH_{self.name}")
        if wanted and not any(text in label for text in wanted.split("|")):
            return  # MATCH_<section>=a|b runs only the section's items labelled with a or b
        if self.over_budget():
            self.add(dict(name=label, skipped="section time limit"))
            return
        t = time.time()
        try:
            item = fn()
            item.setdefault("ok", True)
        except AssertionError as e:
            item = dict(ok=False, error=str(e)[-800:])
        except Exception:
            item = dict(ok=False, error=traceback.format_exc()[-1500:])
        item = dict(name=label, **item, s=round(time.time() - t, 1))
        self.add(item)


def _section_file(name: str) -> str:
    return os.path.join("/tmp", f"norms_gpu_{name}.json")


def size(m: int, k: int, *rest: int) -> tuple[int, ...]:
    """Real sizes, or toy ones under SMOKE (the interpreter is slow)."""
    if not SMOKE:
        return (m, k, *rest)
    toy_k = 2048 if k >= 2048 else 1024
    return (min(m, 8), toy_k, *(min(r, 256) for r in rest))


def post_size(m: int, k: int, n: int) -> tuple[int, int, int]:
    return (m, k, n) if not SMOKE else (64, 128, 512 if n > 256 else 256)


def post_pick(m: int, k: int, n: int, kind: str, residual: bool):
    """The sizes a post-norm case runs at and its config: what impl="mosaic" runs on the
    GPU (a cluster or a grid group); under SMOKE, the interpreter's at toy sizes."""
    from pallas_kernels import post_norm_matmul as pn

    mm, kk, nn = post_size(m, k, n)
    if SMOKE:
        return (mm, kk, nn), pn.select_config(mm, kk, nn, BF16, kind=kind, residual=residual,
                                              transport=transport(), max_cluster=max_cluster())
    return (mm, kk, nn), pn.select_gpu_config(mm, kk, nn, BF16, kind=kind, residual=residual)


def transport() -> str:
    return "global" if SMOKE else "dsmem"


def max_cluster() -> int | None:
    return 2 if SMOKE else None


def rand(rng, shape, dtype=BF16, scale=1.0, shift=0.0) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape) * scale + shift, dtype)


def copies_for(nbytes: int) -> int:
    """Input copies to rotate through so that one pass exceeds twice the L2 (at most 16)."""
    if SMOKE:
        return 2
    return int(min(16, max(2, -(-2 * L2_BYTES // max(nbytes, 1)))))


def time_us(fn, copies: list[tuple], iterations: int = 5) -> float:
    """Median over iterations of the kernel time of one call, each call on its own inputs."""
    batched = jax.jit(lambda *args: [fn(*a) for a in args])
    if SMOKE:
        jax.block_until_ready(batched(*copies))
        t = time.perf_counter()
        jax.block_until_ready(batched(*copies))
        return (time.perf_counter() - t) * 1e6 / len(copies)
    from jax.experimental.mosaic.gpu import profiler

    _, runs_ms = profiler.measure(batched, iterations=iterations)(*copies)
    return statistics.median(runs_ms) * 1e3 / len(copies)


def rel_err(a: jax.Array, b: jax.Array) -> float:
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


# ---------------------------------------------------------------- correctness


def section_rows(sec: Section) -> None:
    from pallas_kernels import row_norm as rn
    from verify import checks

    rng = np.random.default_rng(1)
    impl = "interpret" if SMOKE else "mosaic"

    def case(op, m, k, dtype=BF16, mean=0.0, scale=True, bias=False):
        def run():
            mm, kk = size(m, k)
            inputs = dict(x=np.asarray(rand(rng, (mm, kk), dtype, shift=mean)), eps=1e-6)
            if scale:
                inputs["scale"] = np.asarray(rand(rng, (kk,), jnp.float32, 0.2, 1.0))
            if bias:
                inputs["bias"] = np.asarray(rand(rng, (kk,), jnp.float32))
            config = rn.select_config(mm, kk, dtype, num_sms=132, max_cluster=max_cluster())
            ratio = checks.check_op(op, impl, **inputs)
            return dict(ratio=round(ratio, 4), config=str(config))
        sec.run(f"{op} {m}x{k} {jnp.dtype(dtype).name} mean={mean:g}", run)

    case("rms_norm", 8192, 4096)
    case("rms_norm", 16, 8192)  # 1 row per CTA, cluster of 8
    case("rms_norm", 3, 12288, jnp.float32)
    case("rms_norm", 4096, 16384, scale=False)
    case("layer_norm", 8192, 4096, bias=True)
    case("layer_norm", 16, 8192, jnp.float32, mean=1e4, bias=True)  # Chan-combined over 8 CTAs
    case("layer_norm", 64, 65536, bias=True)
    case("layer_norm", 256, 8192, jnp.float16, bias=True)

    def transports_agree(kind, m, k, block_m, cluster_k):
        def run():
            mm, kk = size(m, k)
            x = rand(rng, (mm, kk), BF16, shift=3.0)
            g, b = rand(rng, (kk,), BF16), rand(rng, (kk,), jnp.float32)
            outs = []
            for tr in ("dsmem", "global"):
                if SMOKE and tr == "dsmem":
                    continue
                cfg = rn.make_config(mm, kk, BF16, block_m=block_m,
                                     cluster_k=min(cluster_k, max_cluster() or 8), transport=tr)
                outs.append(rn.row_norm(x, g, b if kind == "layer" else None, kind=kind,
                                        eps=1e-6, scale_offset=0.0, config=cfg, interpret=SMOKE))
            one_cta = rn.make_config(mm, kk, BF16, block_m=block_m, cluster_k=1)
            ref32 = rn.row_norm(x, g, b if kind == "layer" else None, kind=kind, eps=1e-6,
                                scale_offset=0.0, config=one_cta, interpret=SMOKE)
            same = all(bool(jnp.all(o == outs[0])) for o in outs)
            assert same, "dsmem and global transports disagree"
            return dict(rel_err_vs_unsplit=rel_err(outs[0], ref32))
        sec.run(f"transports agree {kind} {m}x{k} block_m={block_m} cluster={cluster_k}", run)

    transports_agree("layer", 64, 8192, 1, 8)
    transports_agree("rms", 256, 8192, 4, 2)
    transports_agree("layer", 128, 16384, 2, 4)


def section_post(sec: Section) -> None:
    from pallas_kernels import post_norm_matmul as pn
    from verify import checks

    rng = np.random.default_rng(2)
    impl = "interpret" if SMOKE else "mosaic"

    def case(op, m, k, n, bias_mean=0.0, residual=True, dtype=BF16):
        def run():
            mm, kk, nn = post_size(m, k, n)
            inputs = dict(
                x=np.asarray(rand(rng, (mm, kk), dtype)),
                kernel=np.asarray(rand(rng, (kk, nn), dtype, 1 / np.sqrt(kk))),
                bias=np.asarray(rand(rng, (nn,), jnp.float32, shift=bias_mean)),
                scale=np.asarray(rand(rng, (nn,), jnp.float32, 0.2, 1.0)),
                eps=1e-6)
            if residual:
                inputs["residual"] = np.asarray(rand(rng, (mm, nn), dtype))
            if op == "dense_layer_norm":
                inputs["norm_bias"] = np.asarray(rand(rng, (nn,), jnp.float32))
            kind = "rms" if op == "dense_rms_norm" else "layer"
            config = pn.select_config(-(-mm // 64) * 64, kk, nn, dtype, kind=kind,
                                      max_cluster=max_cluster())
            ratio = checks.check_op(op, impl, **inputs)
            return dict(ratio=round(ratio, 4), config=str(config))
        sec.run(f"{op} {m}x{k}x{n} bias_mean={bias_mean:g}", run)

    case("dense_rms_norm", 256, 2048, 4096)  # 64 x 512 CTA tiles, cluster of 8
    case("dense_rms_norm", 512, 1024, 2048)  # 128 x 256 CTA tiles, cluster of 8
    case("dense_layer_norm", 256, 1024, 1024, bias_mean=100.0)  # cluster of 4
    case("dense_layer_norm", 200, 2048, 4096)  # padded rows, cluster of 8
    case("dense_rms_norm", 128, 512, 256, residual=False)  # one CTA per row block
    case("dense_rms_norm", 256, 1024, 3072, dtype=jnp.float16)
    # Persistent: more row blocks than clusters, several exchanges per cluster.
    case("dense_rms_norm", 4096, 1024, 4096)  # 64 blocks over 16 clusters of 8
    case("dense_layer_norm", 4096, 1024, 2048, bias_mean=100.0)  # 32 blocks, 16 clusters
    case("dense_layer_norm", 2048, 512, 1024, residual=False)  # 16 blocks, 33 clusters of 4
    # Chained row blocks (64 x 4 stages, one pipeline per group): 4 blocks a group of 16,
    # 2 a group of 4 (32 groups: the grid balanced to whole rounds).
    case("dense_rms_norm", 4096, 1024, 4096, residual=False)
    case("dense_rms_norm", 8192, 1024, 1024, residual=False)

    def transports_agree(kind, m, k, n, grid_clusters=None):
        """DSMEM (persistent) and global scratch (one cluster per block): bitwise equal
        where both combine the partials one by one; where global memory holds 8 or more
        partials a row they combine as a matrix, in another order: both then within
        1e-2 of float64."""
        import dataclasses

        def run():
            mm, kk, nn = post_size(m, k, n)
            x, w = rand(rng, (mm, kk)), rand(rng, (kk, nn), BF16, 1 / np.sqrt(kk))
            b, g = rand(rng, (nn,), jnp.float32), rand(rng, (nn,), jnp.float32)
            nb = b if kind == "layer" else None
            outs, as_matrix = [], False
            for tr in ("dsmem", "global"):
                if SMOKE and tr == "dsmem":
                    continue
                cfg = pn.select_config(mm, kk, nn, BF16, kind=kind, transport=tr,
                                       max_cluster=max_cluster())
                if tr == "global":
                    cfg = dataclasses.replace(cfg, grid_clusters=None, chain_blocks=False)
                    as_matrix = pn.row_stats_exchange(cfg, kind).loads_as_matrix
                elif grid_clusters is not None:
                    cfg = dataclasses.replace(cfg, grid_clusters=grid_clusters,
                                              chain_blocks=False)
                outs.append(pn.post_norm_matmul(x, w, b, g, nb, None, kind=kind, eps=1e-6,
                                                config=cfg, interpret=SMOKE)[0])
            errs = [_rel_err_vs_f64(o, kind, x, w, b, g, nb, None) for o in outs]
            assert max(errs) < 1e-2, f"rel err vs float64 {errs}"
            if not as_matrix:
                assert all(bool(jnp.all(o == outs[0])) for o in outs), "transports disagree"
            return dict(transports=len(outs), bitwise=not as_matrix, rel_err_vs_f64=errs)
        sec.run(f"post transports agree {kind} {m}x{k}x{n}", run)

    transports_agree("layer", 256, 1024, 4096)
    transports_agree("rms", 256, 1024, 2048)
    transports_agree("layer", 2048, 1024, 4096, grid_clusters=3)  # 32 blocks, 3 clusters
    transports_agree("rms", 2048, 1024, 2048, grid_clusters=5)  # 16 blocks, 5 clusters


# --------------------------------------------------------------------- timing


def _norm_fns(kind, config, interpret):
    from jaxnorm.backends import xla as jx
    from pallas_kernels import row_norm as rn

    def kernel(x, g, b):
        return rn.row_norm(x, g, b if kind == "layer" else None, kind=kind, eps=1e-6,
                           scale_offset=0.0, config=config, interpret=interpret)

    def xla(x, g, b):
        if kind == "rms":
            return jx.rms_norm(x, g, eps=1e-6, scale_offset=0.0)
        return jx.layer_norm(x, g, b, eps=1e-6, scale_offset=0.0)

    return kernel, xla


def _time_norm(sec, label, m, k, kind, config, with_baselines, dtype=BF16):
    def run():
        rng = np.random.default_rng(m + k)
        nbytes = m * k * jnp.dtype(dtype).itemsize
        n_copies = copies_for(nbytes)
        g, b = rand(rng, (k,), BF16, 0.2, 1.0), rand(rng, (k,), BF16)
        copies = [(rand(rng, (m, k), dtype), g, b) for _ in range(n_copies)]
        kernel, xla = _norm_fns(kind, config, SMOKE)
        err = rel_err(kernel(*copies[0]), xla(*copies[0]))
        item = dict(m=m, k=k, kind=kind, dtype=jnp.dtype(dtype).name, config=str(config),
                    copies=n_copies, rel_err_vs_xla=err)
        item["kernel_us"] = time_us(kernel, copies)
        item["kernel_GBps"] = 2 * nbytes / item["kernel_us"] / 1e3
        if with_baselines:
            item["xla_us"] = time_us(xla, copies)
            item["copy_us"] = time_us(lambda x, g, b: x * jnp.asarray(2, x.dtype), copies)
            item["copy_GBps"] = 2 * nbytes / item["copy_us"] / 1e3
            item["of_copy_bw"] = item["copy_us"] / item["kernel_us"]
            item["speedup_vs_xla"] = item["xla_us"] / item["kernel_us"]
        assert err < 2e-2 or not check, f"kernel differs from xla: rel err {err:.2e}"
        return item
    sec.run(label, run)


# Most important first: a section stops starting items at its time limit.
NORM_TIME_SHAPES = [(8192, 4096), (4096, 4096), (4096, 16384), (16, 8192), (8192, 8192),
                    (4096, 8192), (256, 16384), (1024, 4096)]


def section_norm_time(sec: Section) -> None:
    from pallas_kernels import row_norm as rn

    cases = [(m, k, kind, BF16) for m, k in NORM_TIME_SHAPES for kind in ("rms", "layer")]
    cases.insert(4, (8192, 4096, "rms", jnp.float32))
    for m, k, kind, dtype in cases:
        mm, kk = size(m, k)
        config = rn.select_config(mm, kk, dtype, num_sms=132, transport=transport(),
                                  max_cluster=max_cluster())
        label = f"time {kind} {m}x{k} {jnp.dtype(dtype).name}"
        _time_norm(sec, label, mm, kk, kind, config, True, dtype)


def section_norm_sweep(sec: Section) -> None:
    from pallas_kernels import row_norm as rn

    # (M, K): [(block_m, cluster_k), ...]; few rows (the cluster's case) first.
    sweep = {
        (16, 8192): [(1, 1), (1, 2), (1, 4), (2, 8)],
        (256, 16384): [(1, 1), (1, 4), (1, 8)],
        (1024, 8192): [(1, 1), (2, 1), (1, 2), (4, 1)],
        (4096, 4096): [(1, 1), (2, 1), (8, 1), (16, 1), (4, 2)],
        (8192, 8192): [(1, 1), (4, 1), (2, 2)],
        (4096, 16384): [(1, 2), (2, 1), (1, 4)],
    }
    # The global-scratch transport on the GPU, for comparison with DSMEM (c=8 below).
    if not SMOKE:
        config = rn.make_config(16, 8192, BF16, block_m=1, cluster_k=8, transport="global")
        _time_norm(sec, "sweep rms 16x8192 bm=1 c=8 global", 16, 8192, "rms", config, False)
    for (m, k), splits in sweep.items():
        for block_m, cluster_k in splits:
            mm, kk = size(m, k)
            try:
                config = rn.make_config(mm, kk, BF16, block_m=min(block_m, mm),
                                        cluster_k=min(cluster_k, max_cluster() or 8),
                                        transport=transport())
            except ValueError as e:
                sec.add(dict(name=f"sweep {m}x{k} bm={block_m} c={cluster_k}", skipped=str(e)))
                continue
            _time_norm(sec, f"sweep rms {m}x{k} bm={block_m} c={cluster_k}", mm, kk, "rms",
                       config, False)


def _time_post(sec, label, m, k, n, kind, config, with_baselines, residual=True, check=True,
               pre_norm_sum=None):
    """Kernel time; with baselines also XLA's dot + norm, XLA's dot alone and our plain
    GEMM (the issue's yardstick), and the share of XLA's separate norm time hidden.
    The kernel writes h only with a residual, as the ops do outside autodiff (unless
    `pre_norm_sum` says otherwise). check=False times a kernel whose output is
    knowingly wrong (post_anatomy)."""
    if pre_norm_sum is None:
        pre_norm_sum = residual
    from bench.impls import stock_layer_norm, stock_rms_norm
    from jaxnorm.backends import xla as jx
    from pallas_kernels import plain_matmul
    from pallas_kernels import post_norm_matmul as pn

    def run():
        rng = np.random.default_rng(m + k + n)
        w = rand(rng, (k, n), BF16, 1 / np.sqrt(k))
        b, g = rand(rng, (n,), jnp.float32), rand(rng, (n,), jnp.float32, 0.2, 1.0)
        nb = b if kind == "layer" else None
        n_copies = 2
        copies = [(rand(rng, (m, k)), rand(rng, (m, n)) if residual else None)
                  for _ in range(n_copies)]

        def kernel(x, r):
            return pn.post_norm_matmul(x, w, b, g, nb, r, kind=kind, eps=1e-6, config=config,
                                       pre_norm_sum=pre_norm_sum, interpret=SMOKE)

        def xla(x, r):
            if kind == "rms":
                return jx.dense_rms_norm(x, w, b, g, r, eps=1e-6)
            return jx.dense_layer_norm(x, w, b, g, nb, r, eps=1e-6)

        def stock(x, r):
            """What a user writes without jaxnorm, in bf16; h is an output only with a residual."""
            h = jnp.dot(x, w) + b.astype(x.dtype)
            if r is not None:
                h = h + r
            y = stock_rms_norm(h, g) if kind == "rms" else stock_layer_norm(h, g, nb)
            return (y, h) if r is not None else y

        y, _ = kernel(*copies[0])
        err = rel_err(y, xla(*copies[0])[0])
        flops = 2 * m * k * n
        item = dict(m=m, k=k, n=n, kind=kind, residual=residual, config=str(config),
                    pre_norm_sum=pre_norm_sum, rel_err_vs_xla=err)
        item["kernel_us"] = time_us(kernel, copies)
        item["kernel_TFLOPs"] = flops / item["kernel_us"] / 1e6
        if with_baselines:
            item["xla_norm_us"] = time_us(xla, copies)
            item["xla_dot_us"] = time_us(lambda x, r: jnp.dot(x, w), copies)
            item["stock_us"] = time_us(stock, copies)
            item["vs_stock"] = item["kernel_us"] / item["stock_us"]
            item["plain_us"] = time_us(
                lambda x, r: plain_matmul.plain_matmul(x, w, interpret=SMOKE), copies)
            item["vs_xla_norm"] = item["kernel_us"] / item["xla_norm_us"]
            item["vs_plain"] = item["kernel_us"] / item["plain_us"]
            xla_norm_share = item["xla_norm_us"] - item["xla_dot_us"]
            item["hidden"] = 1 - (item["kernel_us"] - item["plain_us"]) / xla_norm_share
        assert err < 2e-2 or not check, f"kernel differs from xla: rel err {err:.2e}"
        return item
    sec.run(label, run)


POST_TIME_SHAPES = [(8192, 4096, 4096), (8192, 4096, 2048), (4096, 4096, 4096),
                    (4096, 4096, 2048), (8192, 4096, 1024), (4096, 4096, 1024),
                    (8192, 4096, 512)]


def section_post_time(sec: Section) -> None:
    cases = [(shape, "rms", False) for shape in POST_TIME_SHAPES]
    cases += [(shape, kind, True) for shape in ((8192, 4096, 4096), (8192, 4096, 2048),
                                                (8192, 4096, 1024)) for kind in ("rms", "layer")]
    for (m, k, n), kind, residual in cases:
        (mm, kk, nn), config = post_pick(m, k, n, kind, residual)
        label = f"time post {kind} {m}x{k}x{n}{' +res' if residual else ''}"
        _time_post(sec, label, mm, kk, nn, kind, config, True, residual)


# Variants of the GPU pick, by the config fields they change; "with h" also writes the
# pre-norm sum (what autodiff's forward runs).
# (32-wide K steps measured slower than 64 x 3: tests/gpu_norms/h200_results.md.)
# "chained" runs a CTA's row blocks as one pipeline (K steps a multiple of the stages);
# 64 x 2 and 32 x 4 chained measured 7-20% slower (tests/gpu_norms/h200_results.md).
# The two MMA warpgroups stacked (64 x 256 each) or side by side (128 x 128 each): the
# same 128 x 256 CTA tile, one partial a row per CTA or two.
_SPLIT_ROWS = {"split rows": dict(tile_m=64, tile_n=256, split_rows=True),
               "side by side": dict(tile_m=128, tile_n=128, split_rows=False)}
_PIPELINE_VARIANTS = {"64x4": dict(tile_k=64, max_concurrent_steps=4, chain_blocks=False),
                      "64x3": dict(tile_k=64, max_concurrent_steps=3, chain_blocks=False),
                      "64x4 chained": dict(tile_k=64, max_concurrent_steps=4, chain_blocks=True),
                      **_SPLIT_ROWS}
# With a residual: staged in shared memory by TMA, or loaded into registers.
_RESIDUAL_VARIANTS = {**_PIPELINE_VARIANTS,
                      "res staged": dict(residual_in_registers=False),
                      "res in registers 64x4 chained": dict(
                          residual_in_registers=True, tile_k=64, max_concurrent_steps=4,
                          chain_blocks=True),
                      "res in registers 64x3": dict(
                          residual_in_registers=True, tile_k=64, max_concurrent_steps=3,
                          chain_blocks=False)}
# (M, K, N, kind, residual) -> variants. ROUNDS=r times the pick and its variants r times in
# turn (the baselines once), for A/B comparisons within one call.
_SWEEP_ROUNDS = int(os.environ.get("ROUNDS", "1"))
POST_SWEEP = {
    (8192, 4096, 4096, "rms", False): {**_PIPELINE_VARIANTS, "with h": {}},
    (8192, 4096, 2048, "rms", False): {**_PIPELINE_VARIANTS, "with h": {}},
    (8192, 4096, 1024, "rms", False): {**_PIPELINE_VARIANTS, "with h": {}},
    (4096, 4096, 4096, "rms", False): _PIPELINE_VARIANTS,
    (8192, 4096, 4096, "rms", True): _RESIDUAL_VARIANTS,
    (8192, 4096, 2048, "rms", True): _RESIDUAL_VARIANTS,
    (8192, 4096, 4096, "layer", True): _RESIDUAL_VARIANTS,
    (8192, 4096, 2048, "layer", True): _RESIDUAL_VARIANTS,
    (8192, 4096, 1024, "layer", True): _RESIDUAL_VARIANTS,
}


def section_post_sweep(sec: Section) -> None:
    """Pipeline depth and chaining around the GPU pick, and the cost of writing h; the pick
    with its baselines (our plain GEMM among them), each variant checked against XLA."""
    import dataclasses

    from pallas_kernels import post_norm_matmul as pn

    for (m, k, n, kind, residual), variants in POST_SWEEP.items():
        (mm, kk, nn), base = post_pick(m, k, n, kind, residual)
        shape = f"{kind} {m}x{k}x{n}{' +res' if residual else ''}"
        runs = {"pick": (base, None)}
        for name, knobs in variants.items():
            try:
                config = dataclasses.replace(base, **knobs)
                pn.check_shape(mm, kk, nn, config, kind, residual=residual)
            except ValueError as e:
                sec.add(dict(name=f"sweep {shape} {name}", skipped=str(e)))
                continue
            if name != "with h" and config in (c for c, _ in runs.values()):
                continue  # the pick itself, or a variant already timed
            runs[name] = (config, (name == "with h") or None)
        for r in range(_SWEEP_ROUNDS):
            suffix = f" r{r + 1}" if _SWEEP_ROUNDS > 1 else ""
            for name, (config, pre_norm_sum) in runs.items():
                _time_post(sec, f"sweep post {shape} {name}{suffix}", mm, kk, nn, kind, config,
                           name == "pick" and r == 0, residual, pre_norm_sum=pre_norm_sum)


def _rel_err_vs_f64(y, kind, x, w, b, g, nb, r) -> float:
    """max |y - y64| / max |y64| against the float64 post-norm of the same inputs."""
    from verify import references as ref

    h64 = ref.pre_norm_sum(np.asarray(x), np.asarray(w), np.asarray(b),
                           None if r is None else np.asarray(r))
    if kind == "rms":
        y64 = ref.rms_normalized(h64, 1e-6) * np.asarray(g, np.float64)
    else:
        mu, inv = ref.mean_and_inverse_std(h64, 1e-6)
        y64 = (h64 - mu) * inv * np.asarray(g, np.float64) + np.asarray(nb, np.float64)
    err = np.abs(np.asarray(y, np.float64) - y64)
    return float(err.max() / np.abs(y64).max())


def section_post_semaphore(sec: Section) -> None:
    """The grid-group ("semaphore") transport: bitwise against the interpreter-tested global
    transport (one cluster per block) and within 1e-2 of float64."""
    import dataclasses

    from pallas_kernels import post_norm_matmul as pn

    rng = np.random.default_rng(6)

    def agree(kind, m, k, n, residual, bias_mean=0.0, **changes):
        def run():
            x, w = rand(rng, (m, k)), rand(rng, (k, n), BF16, 1 / np.sqrt(k))
            b = rand(rng, (n,), jnp.float32, shift=bias_mean)
            g = rand(rng, (n,), jnp.float32, 0.2, 1.0)
            r = rand(rng, (m, n)) if residual else None
            nb = b if kind == "layer" else None
            sem = dataclasses.replace(pn.select_config(m, k, n, BF16, kind=kind,
                                                       residual=residual, transport="semaphore"),
                                      **changes)
            glob = dataclasses.replace(
                pn.select_config(m, k, n, BF16, kind=kind, residual=residual, transport="global"),
                grid_clusters=None, chain_blocks=False, **changes)
            outs = [pn.post_norm_matmul(x, w, b, g, nb, r, kind=kind, eps=1e-6, config=c)
                    for c in (sem, glob)]
            y_only, no_h = pn.post_norm_matmul(x, w, b, g, nb, r, kind=kind, eps=1e-6,
                                               config=sem, pre_norm_sum=False)
            assert no_h is None and bool(jnp.all(y_only == outs[0][0])), \
                "y differs when h is not written"
            # Same tiles: the same partials combined in the same order, so bitwise equal.
            # (Rows of 4096 take 64 x 512 tiles in a cluster but 128 x 256 in a group.)
            same_tiles = (sem.tile_m, sem.tile_n) == (glob.tile_m, glob.tile_n)
            assert bool(jnp.all(outs[0][1] == outs[1][1])), "h differs from global"
            if same_tiles:
                assert bool(jnp.all(outs[0][0] == outs[1][0])), "y differs from global"
            item = dict(config=str(sem), blocks=m // sem.tile_m, bitwise_y=same_tiles)
            item["max_rel_err_vs_f64"] = _rel_err_vs_f64(outs[0][0], kind, x, w, b, g, nb, r)
            assert item["max_rel_err_vs_f64"] < 1e-2
            return item
        label = f"{kind} {m}x{k}x{n}{' +res' if residual else ''}"
        sec.run(f"semaphore agrees {label}{' split rows' if changes else ''}", run)

    agree("rms", 2048, 1024, 4096, False)  # 16 blocks over 8 groups of 16: 2 rounds
    agree("layer", 4096, 1024, 2048, True, bias_mean=100.0)  # 32 blocks, 16 groups of 8
    agree("rms", 8192, 512, 1024, True)  # 64 blocks, 33 groups of 4
    agree("layer", 2048, 512, 512, False)  # 16 blocks, 16 of 66 groups of 2
    # Stacked 64 x 256 warpgroups with a residual in registers, epilogue 64 columns at a time.
    agree("layer", 4096, 1024, 2048, True, bias_mean=100.0, tile_m=64, tile_n=256,
          split_rows=True)


def section_post_kernels(sec: Section) -> None:
    """The kernels one call of the GPU pick launches, each with its CUPTI time (median of 5
    calls): jax zero-fills a kernel's global semaphores before every call, in a kernel
    of its own that the timings above include."""
    from jax.experimental.mosaic.gpu import profiler

    from pallas_kernels import post_norm_matmul as pn

    for m, k, n in ((8192, 4096, 2048), (4096, 4096, 1024), (8192, 4096, 4096)):
        def run(m=m, k=k, n=n):
            rng = np.random.default_rng(m + n)
            x, w = rand(rng, (m, k)), rand(rng, (k, n), BF16, 1 / np.sqrt(k))
            b, g = rand(rng, (n,), jnp.float32), rand(rng, (n,), jnp.float32, 0.2, 1.0)
            config = pn.select_gpu_config(m, k, n, BF16, kind="rms")
            call = jax.jit(lambda x: pn.post_norm_matmul(
                x, w, b, g, None, None, kind="rms", eps=1e-6, config=config,
                pre_norm_sum=False)[0])
            _, calls = profiler.measure(call, aggregate=False, iterations=5)(x)
            kernels = {f"{i} {name[:48]}": round(statistics.median(
                c[i][1] for c in calls) * 1e3, 2) for i, (name, _) in enumerate(calls[0])}
            return dict(config=str(config), kernels_us=kernels)
        sec.run(f"kernels of one call rms {m}x{k}x{n}", run)


def section_post_anatomy(sec: Section) -> None:
    """Where a grid group's time goes: the same kernels with parts of the statistics
    exchange removed (timing only: the outputs are then wrong, and not checked)."""
    import contextlib

    import jax.experimental.pallas.mosaic_gpu as plgpu

    from pallas_kernels import cluster_exchange as cx
    from pallas_kernels import post_norm_matmul as pn
    from pallas_kernels import row_norm

    def nothing(*_, **__):
        return None

    def gathered_as_is(self, scratch, gmem_scratch, site):
        return scratch.gathered if scratch.gathered is not None else gmem_scratch.at[site[1]]

    def own_partial_only(partial, num_partials, k, eps):
        """RMS from this warpgroup's own partial: one load instead of one per party."""
        return row_norm.safe_rsqrt(partial(0, 0) * (num_partials / k) + eps)

    no_exchange = {(cx.RowStatsExchange, "publish"): nothing,
                   (cx.RowStatsExchange, "collect"): gathered_as_is,
                   (cx.RowStatsExchange, "release"): nothing,
                   (cx.RowStatsExchange, "finish"): nothing}
    signal_released = cx._signal_released

    def signal_without_fence(semaphore, fence):
        return signal_released(semaphore, fence=False)

    removals = {
        "full": {},
        # The signalling thread's release fence (the waiter's acquire is jax's own).
        "no fences": {(cx, "_signal_released"): signal_without_fence},
        "no semaphore wait": {(plgpu, "semaphore_wait"): nothing},
        "no exchange": no_exchange,
        # What reading every party's partials costs: the same, loading one of them.
        "no exchange, one partial load": {
            **no_exchange, (cx.RowStatsExchange, "loads_as_matrix"): property(lambda _: False),
            (pn, "combine_rms"): own_partial_only},
    }

    @contextlib.contextmanager
    def removed(patches):
        saved = {(owner, name): getattr(owner, name) for owner, name in patches}
        for (owner, name), value in patches.items():
            setattr(owner, name, value)
        try:
            yield
        finally:
            for (owner, name), value in saved.items():
                setattr(owner, name, value)

    for m, k, n in ((8192, 4096, 2048), (8192, 4096, 4096), (8192, 4096, 1024)):
        base = pn.select_config(m, k, n, BF16, kind="rms", transport="semaphore")
        for what, patches in removals.items():
            with removed(patches):
                _time_post(sec, f"anatomy {m}x{k}x{n} inline {what}", m, k, n, "rms", base,
                           what == "full", False, check=False)


# ---------------------------------------------------------------------- driver


def _row(item: dict) -> str:
    name = item.get("name", "?")[:58]
    if "skipped" in item:
        return f"{name:58s} skipped"
    if not item.get("ok", False):
        return f"{name:58s} FAIL {item.get('error', '')[-160:]!r}"
    if "ratio" in item:
        return f"{name:58s} ok err/tol={item['ratio']:.3f}"
    if "copy_us" in item:
        return (f"{name:58s} {item['kernel_us']:8.1f}us {item['kernel_GBps']:6.0f}GB/s "
                f"xla {item['xla_us']:8.1f}us copy {item['copy_GBps']:6.0f}GB/s "
                f"of_copy={item['of_copy_bw']:.2f} x_xla={item['speedup_vs_xla']:.2f}")
    if "xla_norm_us" in item:
        return (f"{name:58s} {item['kernel_us']:8.1f}us {item['kernel_TFLOPs']:5.0f}TF/s "
                f"xla_norm {item['xla_norm_us']:8.1f}us dot {item['xla_dot_us']:8.1f}us "
                f"plain {item['plain_us']:8.1f}us k/plain={item['vs_plain']:.3f} "
                f"k/xla={item['vs_xla_norm']:.3f} hidden={item['hidden']:.2f} "
                f"stock {item['stock_us']:8.1f}us k/stock={item['vs_stock']:.3f}")
    if "kernel_TFLOPs" in item:
        return f"{name:58s} {item['kernel_us']:8.1f}us {item['kernel_TFLOPs']:5.0f}TF/s"
    if "kernel_us" in item:
        return f"{name:58s} {item['kernel_us']:8.1f}us {item['kernel_GBps']:6.0f}GB/s"
    return f"{name:58s} ok {json.dumps({k: v for k, v in item.items() if k != 'name'})[:120]}"


def main() -> None:
    results = {"device": str(jax.devices()[0]), "jax": jax.__version__, "smoke": SMOKE}
    for name, limit in SECTIONS.items():
        if os.path.exists(_section_file(name)):
            os.remove(_section_file(name))
        t = time.time()
        rc = _run_limited(name, 900 if SMOKE else limit)
        items = []
        if os.path.exists(_section_file(name)):
            with open(_section_file(name)) as f:
                items = json.load(f)
        results[name] = dict(items=items, rc=rc, s=round(time.time() - t, 1))
        with open(os.path.join(OUT, "norms_gpu.json"), "w") as f:
            json.dump(results, f, indent=1)
        if rc == "timeout":  # a hung kernel: do not spend the rest of the call on its kin
            print(f"section {name} timed out; stopping")
            break
    print("\n==== summary ====")
    for name in [name for name in SECTIONS if name in results]:
        print(f"-- {name} (rc={results[name]['rc']}, {results[name]['s']}s)")
        for item in results[name]["items"]:
            print(_row(item))


def _run_limited(name: str, limit: int) -> int | str:
    """Run one section in its own process; a hung kernel costs that section only."""
    try:
        return subprocess.run([sys.executable, __file__, name], timeout=limit).returncode
    except subprocess.TimeoutExpired:
        return "timeout"


def _load_backends() -> None:
    """Register the Mosaic backends; if a module this issue does not own fails to import,
    carry on with ours (and say so) rather than lose the run."""
    from jaxnorm import dispatch

    try:
        dispatch._load_mosaic_backends()
    except Exception:
        print("WARNING: Mosaic backends failed to load; using mosaic_norms only:\n"
              + traceback.format_exc()[-800:])
        import jaxnorm.backends.mosaic_norms  # noqa: F401


if __name__ == "__main__":
    if len(sys.argv) > 1:
        _load_backends()
        section = Section(sys.argv[1])
        globals()[f"section_{sys.argv[1]}"](section)
    else:
        main()
