"""Fingerprints of every kernel's jaxpr at the automatic picks and a spread of configs.

A refactoring of pallas_kernels that must not change what the GPU runs is checked by
running this before and after it and comparing the hash lists (`--compare`):

    PYTHONPATH=. python bench/gpu/kernel_jaxprs.py --out /tmp/before.json   # at the base
    PYTHONPATH=. python bench/gpu/kernel_jaxprs.py --out /tmp/after.json    # at the head
    python bench/gpu/kernel_jaxprs.py --compare /tmp/before.json /tmp/after.json

Runs on a CPU: kernels are traced, never run (interpret=False traces the GPU kernel;
the GEMM's SM count comes from an abstract H200 mesh). Only public entry points that
predate the clean-up of issue 22 are used, so the same script runs at both commits.
A case whose shape a kernel does not serve records the reason instead of a hash.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
from jax.sharding import AbstractDevice, AbstractMesh

S = jax.ShapeDtypeStruct
BF16 = jnp.bfloat16
F32 = jnp.float32
H200 = AbstractMesh((), (), abstract_device=AbstractDevice(device_kind="H200", platform="gpu",
                                                            num_cores=132))
Case = tuple[str, Callable[..., object], tuple[S | None, ...]]


def _gemm_cases() -> Iterator[Case]:
    from pallas_kernels import lazy_norm_matmul as lz
    from pallas_kernels import plain_matmul as pm

    shapes = [(8192, 4096, 14336), (2048, 4096, 6144), (16, 4096, 6144), (16, 4096, 14336),
              (300, 4096, 4096), (1, 4096, 4096), (64, 1024, 512)]
    for m, k, n in shapes:
        x, w, w2 = S((m, k), BF16), S((k, n), BF16), S((k, n // 2), BF16)
        b, g = S((n,), F32), S((k,), F32)
        tag = f"{m}x{k}x{n}"
        for interpret in (False, True):
            if interpret and m * n > 64 * 4096:
                continue
            it = "interp" if interpret else "gpu"
            yield (f"gemm/plain/{tag}/{it}",
                   lambda x, w, i=interpret: pm.plain_matmul(x, w, interpret=i), (x, w))
            yield (f"gemm/rms_bias/{tag}/{it}",
                   lambda x, w, b, i=interpret: lz.lazy_rms_matmul(x, [w], biases=[b],
                                                                   interpret=i), (x, w, b))
            yield (f"gemm/rms_gain_two/{tag}/{it}",
                   lambda x, w, w2, g, i=interpret: lz.lazy_rms_matmul(
                       x, [w, w2], scale=g, scale_offset=1.0, interpret=i), (x, w, w2, g))
            yield (f"gemm/rms_row_stats/{tag}/{it}",
                   lambda x, w, w2, i=interpret: lz.lazy_rms_matmul(
                       x, [w, w2], return_row_stats=True, interpret=i), (x, w, w2))
            yield (f"gemm/ln_lazy_two/{tag}/{it}",
                   lambda x, w, w2, g, b, i=interpret: lz.lazy_layer_norm_matmul(
                       x, [w, w2], scale=g, norm_bias=g, biases=[b, None], prenormalize=False,
                       interpret=i), (x, w, w2, g, b))
            yield (f"gemm/ln_auto/{tag}/{it}",
                   lambda x, w, g, i=interpret: lz.lazy_layer_norm_matmul(
                       x, [w], scale=g, norm_bias=g, interpret=i), (x, w, g))
            yield (f"gemm/ln_prenormalized/{tag}/{it}",
                   lambda x, w, i=interpret: lz.lazy_layer_norm_matmul(x, [w], prenormalize=True,
                                                                       interpret=i), (x, w))
    # Explicit configs off the picks.
    m, k, n = 512, 1024, 1024
    x, w = S((m, k), BF16), S((k, n), BF16)
    for name, config in {
        "wgM_64x64_s6": lz.TuningConfig(tile_m=64, tile_n=64, max_concurrent_steps=6,
                                        wg_dimension=lz.MatmulDimension.M),
        "128x256_epi32": lz.TuningConfig(tile_m=128, tile_n=256, epi_tile_n=32,
                                         max_concurrent_steps=3),
        "gridM_w4": lz.TuningConfig(grid_minor_dim=lz.MatmulDimension.M, grid_tile_width=4),
        "tile_k128": lz.TuningConfig(tile_k=128, max_concurrent_steps=3),
    }.items():
        yield (f"gemm/config/{name}/rms", lambda x, w, c=config: lz.lazy_rms_matmul(
            x, [w], config=c), (x, w))
        yield (f"gemm/config/{name}/ln", lambda x, w, c=config: lz.lazy_layer_norm_matmul(
            x, [w], prenormalize=False, config=c), (x, w))
        yield (f"gemm/config/{name}/plain", lambda x, w, c=config: pm.plain_matmul(
            x, w, config=c), (x, w))
    try:
        from pallas_kernels import residual_matmul as rm
    except ImportError:  # a commit before the residual GEMM
        return
    for m, k, n in [(8192, 4096, 4096), (8192, 14336, 4096), (16, 4096, 4096)]:
        yield (f"gemm/residual_bias/{m}x{k}x{n}/gpu",
               lambda x, w, r, b: rm.residual_matmul(x, w, r, bias=b),
               (S((m, k), BF16), S((k, n), BF16), S((m, n), BF16), S((n,), F32)))


def _row_norm_cases() -> Iterator[Case]:
    from pallas_kernels import row_norm as rn

    shapes = [(8192, 4096), (16, 8192), (4096, 16384), (64, 65536), (3, 12288), (1, 4096),
              (2, 1152), (16, 320), (4, 64), (256, 8192)]
    for m, k in shapes:
        for dtype in (BF16, F32):
            for kind in ("rms", "layer"):
                for transport, max_cluster in (("dsmem", None), ("global", 2)):
                    name = f"row_norm/{kind}/{m}x{k}/{jnp.dtype(dtype).name}/{transport}"
                    try:
                        config = rn.select_config(m, k, dtype, num_sms=132, transport=transport,
                                                  max_cluster=max_cluster)
                    except (ValueError, NotImplementedError) as reason:
                        yield name, _unsupported(reason), ()
                        continue
                    fn = functools.partial(rn.row_norm, kind=kind, eps=1e-6, scale_offset=1.0,
                                           config=config,
                                           interpret=transport == "global")
                    bias = S((k,), F32) if kind == "layer" else None
                    yield name, fn, (S((m, k), dtype), S((k,), dtype), bias)
    for name, config in {
        "1row_c8": rn.RowNormConfig(block_m=1, warps_per_row=4, cluster_k=8, chunk_k=1024),
        "4rows_c2": rn.RowNormConfig(block_m=4, cluster_k=2, chunk_k=1024),
        "2rows_c4": rn.RowNormConfig(block_m=2, warps_per_row=2, cluster_k=4, chunk_k=1024),
        "8rows_v8": rn.RowNormConfig(block_m=8, chunk_k=512, vector_bytes=8),
    }.items():
        for transport in ("dsmem", "global"):
            c = dataclasses.replace(config, transport=transport)
            fn = functools.partial(rn.row_norm, kind="layer", eps=1e-6, scale_offset=0.0,
                                   config=c, interpret=transport == "global")
            yield f"row_norm/config/{name}/{transport}", fn, (S((256, 8192), BF16), None, None)


def _post_norm_cases() -> Iterator[Case]:
    from pallas_kernels import post_norm_matmul as pn

    def case(name, m, k, n, kind, config, residual, vectors=True, pre_norm_sum=True,
             interpret=False):
        fn = functools.partial(pn.post_norm_matmul, kind=kind, eps=1e-6, config=config,
                               pre_norm_sum=pre_norm_sum, interpret=interpret)
        vec = S((n,), F32) if vectors else None
        norm_bias = vec if kind == "layer" else None
        return (name, fn, (S((m, k), BF16), S((k, n), BF16), vec, vec, norm_bias,
                           S((m, n), BF16) if residual else None))

    shapes = [(8192, 4096, 4096), (8192, 4096, 2048), (8192, 4096, 1024), (8192, 4096, 512),
              (4096, 4096, 2048), (2048, 4096, 3072), (256, 1024, 256), (128, 256, 512)]
    for m, k, n in shapes:
        for kind in ("rms", "layer"):
            for residual in (False, True):
                tag = f"{kind}/{m}x{k}x{n}/{'res' if residual else 'nores'}"
                pickers = {
                    "gpu_pick": lambda: pn.select_gpu_config(m, k, n, BF16, kind=kind,
                                                             residual=residual),
                    "dsmem": lambda: pn.select_config(m, k, n, BF16, kind=kind,
                                                      residual=residual, transport="dsmem"),
                    "semaphore": lambda: pn.select_config(m, k, n, BF16, kind=kind,
                                                          residual=residual,
                                                          transport="semaphore"),
                    "interp": lambda: pn.select_config(m, k, n, BF16, kind=kind,
                                                       residual=residual, transport="global",
                                                       max_cluster=2),
                }
                for picker, pick in pickers.items():
                    name = f"post_norm/{picker}/{tag}"
                    try:
                        config = pick()
                    except (ValueError, NotImplementedError) as reason:
                        yield name, _unsupported(reason), ()
                        continue
                    interpret = picker == "interp"
                    if interpret and m * n > 256 * 1024:
                        continue
                    yield case(name, m, k, n, kind, config, residual, interpret=interpret)
                    if picker == "gpu_pick":
                        yield case(name + "/no_h", m, k, n, kind, config, residual,
                                   pre_norm_sum=False)
                        yield case(name + "/no_vectors", m, k, n, kind, config, residual,
                                   vectors=False)
    m, k, n = 8192, 4096, 2048
    base = pn.select_gpu_config(m, k, n, BF16, kind="rms")
    explicit = {
        "chained_rms_s4": dataclasses.replace(base, max_concurrent_steps=4, chain_blocks=True),
        "side_by_side": dataclasses.replace(base, tile_m=128, tile_n=128, split_rows=False,
                                            cluster_n=8, chain_blocks=False,
                                            max_concurrent_steps=3),
        "stacked_dsmem": pn.PostNormConfig(tile_m=64, tile_n=256, cluster_n=8, split_rows=True,
                                           max_concurrent_steps=3),
        "regs_residual_dsmem": pn.PostNormConfig(tile_m=128, tile_n=128, cluster_n=8,
                                                 residual_in_registers=True,
                                                 max_concurrent_steps=3),
        "global_grid4": pn.PostNormConfig(tile_m=128, tile_n=128, cluster_n=8,
                                          transport="global", grid_clusters=4),
    }
    for name, config in explicit.items():
        for kind in ("rms", "layer"):
            for residual in (False, True):
                yield case(f"post_norm/config/{name}/{kind}/{'res' if residual else 'nores'}",
                           m, k, n, kind, config, residual)


def _jaxnorm_cases() -> Iterator[Case]:
    """The backends' picks and padding through the public ops (interpret: runs on CPU at both
    commits; the dense ops also as for the GPU)."""
    import jaxnorm

    shapes = [(8, 256, 256), (100, 256, 512), (130, 512, 256), (3, 128, 128)]
    for m, k, n in shapes:
        x, w, r = S((m, k), BF16), S((k, n), BF16), S((m, n), BF16)
        gk, gn = S((k,), F32), S((n,), F32)
        tag = f"{m}x{k}x{n}"
        yield (f"jaxnorm/rms_norm/{tag}",
               lambda x, g: jaxnorm.rms_norm(x, g, impl="interpret"), (x, gk))
        yield (f"jaxnorm/layer_norm/{tag}",
               lambda x, g: jaxnorm.layer_norm(x, g, g, impl="interpret"), (x, gk))
        for impl in ("interpret", "mosaic"):
            yield (f"jaxnorm/rms_norm_dense/{tag}/{impl}",
                   lambda x, g, w, i=impl: jaxnorm.rms_norm_dense(x, g, w, impl=i), (x, gk, w))
            yield (f"jaxnorm/layer_norm_dense/{tag}/{impl}",
                   lambda x, g, w, i=impl: jaxnorm.layer_norm_dense(x, g, g, w, impl=i),
                   (x, gk, w))
        yield (f"jaxnorm/dense_rms_norm/{tag}",
               lambda x, w, g, r: jaxnorm.dense_rms_norm(x, w, g, g, residual=r,
                                                         impl="interpret"), (x, w, gn, r))
        yield (f"jaxnorm/dense_layer_norm/{tag}",
               lambda x, w, g: jaxnorm.dense_layer_norm(x, w, g, g, g, impl="interpret"),
               (x, w, gn))


def _unsupported(reason: Exception) -> Callable[..., object]:
    message = str(reason)

    def record():
        raise _Declined(message)

    return record


class _Declined(Exception):
    pass


def fingerprint(fn: Callable[..., object], avals: tuple[S | None, ...]) -> str:
    """sha256 of the jaxpr's text ('unsupported: <reason>' where a kernel refuses the case)."""
    try:
        with jax.sharding.use_abstract_mesh(H200):
            text = str(jax.make_jaxpr(fn)(*avals))
    except (_Declined, ValueError, NotImplementedError) as reason:
        # Config reprs name the post-norm knobs that issue 22 removed (never set).
        return "unsupported: " + str(reason).replace("multicast=False, delay_release=0, ", "")
    return hashlib.sha256(text.encode()).hexdigest()


def all_cases() -> Iterator[Case]:
    yield from _gemm_cases()
    yield from _row_norm_cases()
    yield from _post_norm_cases()
    yield from _jaxnorm_cases()


def compare(before: str, after: str) -> int:
    """Print the cases whose fingerprints differ or that one side lacks; 1 if any differ."""
    with open(before) as f:
        a = json.load(f)
    with open(after) as f:
        b = json.load(f)
    same = sorted(k for k in a if k in b and a[k] == b[k])
    changed = sorted(k for k in a if k in b and a[k] != b[k])
    print(f"{len(same)} identical, {len(changed)} changed, {len(set(a) - set(b))} only before, "
          f"{len(set(b) - set(a))} only after")
    for k in changed:
        print(f"CHANGED {k}\n  before {a[k]}\n  after  {b[k]}")
    for k in sorted(set(a) ^ set(b)):
        print(f"{'ONLY BEFORE' if k in a else 'ONLY AFTER'} {k}")
    return 1 if changed or set(a) ^ set(b) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON file of {case: fingerprint} (default: $OUT or a "
                        "temporary folder, kernel_jaxprs.json)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="compare two fingerprint files instead of computing one")
    parser.add_argument("--only", default="", help="only cases whose name starts with this")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    out = args.out or os.path.join(os.environ.get("OUT") or tempfile.mkdtemp(),
                                   "kernel_jaxprs.json")
    prints = {}
    for name, fn, avals in all_cases():
        if name.startswith(args.only):
            prints[name] = fingerprint(fn, avals)
            print(f"{prints[name][:16]}  {name}", flush=True)
    with open(out, "w") as f:
        json.dump(prints, f, indent=1, sort_keys=True)
    print(f"{len(prints)} cases -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
