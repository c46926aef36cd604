"""GPU checks of the six ops at the sizes models use, and of the norm and GEMM kernels'
variants the backends do not all pick (transports, row statistics, the gain in the mainloop)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bench.gpu.kernel_checks.common import (BF16, F16, F32, IMPL, INTERPRET, SMOKE, Case, Skipped,
                                            assert_bitwise, draw, gpu_transport, sized)
from jaxnorm import row_stats
from pallas_kernels import gemm_config, hardware
from pallas_kernels import lazy_norm_matmul as lz
from pallas_kernels import post_norm_matmul as pn
from pallas_kernels import row_norm as rn
from verify import checks
from verify import residual as vr


def op_inputs(rng, op: str, m: int, k: int, n: int, dtype, *, residual: bool | str,
               mean: float = 0.0) -> dict[str, Any]:
    """Fresh random inputs of `op` as verify's checks take them; residual="after" draws
    the post-norm ops' `residual_after` (added after the norm)."""
    inputs: dict[str, Any] = dict(x=draw(rng, (m, k), dtype, shift=mean), eps=1e-6)
    if op in ("rms_norm", "layer_norm"):
        inputs["scale"] = draw(rng, (k,), F32, 0.2, 1.0)
        if op == "layer_norm":
            inputs["bias"] = draw(rng, (k,), F32)
        return inputs
    if op in ("rms_norm_dense", "layer_norm_dense"):
        inputs["kernel"] = [draw(rng, (k, n), dtype, 1 / np.sqrt(k)),
                            draw(rng, (k, n // 2), dtype, 1 / np.sqrt(k))]
        inputs["bias"] = [draw(rng, (n,), F32), None]
        inputs["scale"] = draw(rng, (k,), F32, 0.2, 1.0)
        if op == "layer_norm_dense":
            inputs["norm_bias"] = draw(rng, (k,), F32, 0.2)
        return inputs
    inputs["kernel"] = draw(rng, (k, n), dtype, 1 / np.sqrt(k))
    inputs["bias"] = draw(rng, (n,), F32)
    inputs["scale"] = draw(rng, (n,), F32, 0.2, 1.0)
    if op == "dense_layer_norm":
        inputs["norm_bias"] = draw(rng, (n,), F32)
    if residual:
        inputs["residual_after" if residual == "after" else "residual"] = draw(rng, (m, n),
                                                                                dtype)
    return inputs


def run_op(op: str, inputs: dict[str, Any]):
    """The op's outputs under IMPL, as verify's judge pairs them."""
    import jaxnorm

    x, eps, scale = inputs["x"], inputs["eps"], inputs.get("scale")
    if op == "rms_norm":
        return jaxnorm.rms_norm(x, scale, eps=eps, impl=IMPL)
    if op == "layer_norm":
        return jaxnorm.layer_norm(x, scale, inputs["bias"], eps=eps, impl=IMPL)
    if op == "rms_norm_dense":
        return jaxnorm.rms_norm_dense(x, scale, inputs["kernel"], inputs["bias"], eps=eps,
                                      impl=IMPL)
    if op == "layer_norm_dense":
        return jaxnorm.layer_norm_dense(x, scale, inputs["norm_bias"], inputs["kernel"],
                                        inputs["bias"], eps=eps, impl=IMPL)
    fn = jaxnorm.dense_rms_norm if op == "dense_rms_norm" else jaxnorm.dense_layer_norm
    vectors = (inputs["bias"], scale) + ((inputs["norm_bias"],) if "norm_bias" in inputs else ())
    if inputs.get("residual_after") is not None:  # r + Norm(x @ W + b): y alone
        return fn(x, inputs["kernel"], *vectors, residual_after=inputs["residual_after"],
                  eps=eps, impl=IMPL), None
    if inputs.get("residual") is None:  # y alone: the kernel writes no h
        return fn(x, inputs["kernel"], *vectors, eps=eps, impl=IMPL), None
    return fn(x, inputs["kernel"], *vectors, residual=inputs["residual"], eps=eps, impl=IMPL)


# (op, full size, smoke size, dtype, residual, row mean): the backends' picks at the sizes
# models use, clusters and grid groups of every width, padded rows, f16, large means;
# residual "after" is r + Norm(x @ W + b) at Gemma-2-9B's (N = 3584), OLMo-2's and
# Gemma-3-1B's (N = 1152: a grid group of 9 CTAs a row) shapes.
OP_CASES = [
    ("rms_norm", (8192, 4096, 0), (64, 1024, 0), BF16, False, 0.0),
    ("rms_norm", (16, 8192, 0), (4, 2048, 0), BF16, False, 0.0),
    ("rms_norm", (3, 12288, 0), (3, 1024, 0), F32, False, 0.0),
    ("layer_norm", (8192, 4096, 0), (64, 1024, 0), BF16, False, 0.0),
    ("layer_norm", (16, 8192, 0), (4, 2048, 0), F32, False, 1e4),
    ("layer_norm", (64, 65536, 0), (4, 4096, 0), BF16, False, 0.0),
    ("layer_norm", (256, 8192, 0), (16, 512, 0), F16, False, 0.0),
    ("rms_norm_dense", (1, 4096, 4096), (1, 128, 128), BF16, False, 0.0),
    ("rms_norm_dense", (2048, 4096, 6144), (130, 128, 256), BF16, False, 0.0),
    ("rms_norm_dense", (130, 512, 1024), (67, 128, 128), F16, False, 0.0),
    ("layer_norm_dense", (16, 4096, 4096), (16, 128, 128), BF16, False, 0.0),
    ("layer_norm_dense", (2048, 4096, 4096), (128, 128, 256), BF16, False, 100.0),
    ("dense_rms_norm", (8192, 4096, 4096), (128, 128, 512), BF16, True, 0.0),
    ("dense_rms_norm", (8192, 4096, 2048), (128, 128, 256), BF16, False, 0.0),
    ("dense_rms_norm", (4096, 4096, 1024), (64, 64, 256), BF16, True, 0.0),
    ("dense_rms_norm", (200, 2048, 3072), (50, 128, 256), F16, True, 0.0),
    ("dense_layer_norm", (8192, 4096, 2048), (128, 128, 512), BF16, True, 100.0),
    ("dense_layer_norm", (2048, 512, 1024), (64, 64, 256), BF16, False, 0.0),
    ("dense_rms_norm", (4096, 4096, 3584), (50, 128, 512), BF16, "after", 0.0),
    ("dense_rms_norm", (4096, 4096, 4096), (128, 128, 256), BF16, "after", 0.0),
    ("dense_layer_norm", (4096, 4096, 2048), (64, 64, 256), BF16, "after", 100.0),
    ("dense_rms_norm", (4096, 1024, 1152), (64, 128, 256), BF16, "after", 0.0),
    ("dense_rms_norm", (2048, 6912, 1152), (64, 128, 256), BF16, "after", 0.0),
]


def op_cases() -> list[Case]:
    cases = []
    for i, (op, full, smoke, dtype, residual, mean) in enumerate(OP_CASES):
        m, k, n = sized(full, smoke)
        label = (f"{op} {m}x{k}{f'x{n}' if n else ''} {jnp.dtype(dtype).name}"
                 f"{' +res' if residual else ''}{' after' if residual == 'after' else ''}"
                 f"{f' mean={mean:g}' if mean else ''}")

        def correct(op=op, m=m, k=k, n=n, dtype=dtype, residual=residual, mean=mean, i=i):
            inputs = op_inputs(np.random.default_rng(i), op, m, k, n, dtype,
                                residual=residual, mean=mean)
            return f"err/tol {checks.check_outputs(op, run_op(op, inputs), **inputs):.3f}"

        def nan_isolated(op=op, m=m, k=k, n=n, dtype=dtype, residual=residual, i=i):
            inputs = op_inputs(np.random.default_rng(100 + i), op, m, k, n, dtype,
                                residual=residual)
            x = np.array(inputs["x"])
            x[m // 2, k // 3] = np.nan
            inputs["x"] = x
            return f"err/tol {checks.check_outputs(op, run_op(op, inputs), **inputs):.3f}"

        def repeatable(op=op, m=m, k=k, n=n, dtype=dtype, residual=residual, i=i):
            inputs = op_inputs(np.random.default_rng(200 + i), op, m, k, n, dtype,
                                residual=residual)
            first, second = (jax.tree.leaves(run_op(op, inputs)) for _ in range(2))
            assert_bitwise(first, second, "second call")
            return "bitwise"

        cases += [("correct", label, correct), ("NaN isolated", label, nan_isolated),
                  ("repeatable", label, repeatable)]
    return cases


def kernel_cases() -> list[Case]:
    """Variants the backends do not all pick at these sizes: transports against each other,
    the GEMM's row statistics and prenormalized LayerNorm."""
    cases = []
    max_cluster = hardware.INTERPRET_MAX_CLUSTER if SMOKE else None

    def row_transports(kind, full, smoke, block_m, cluster_k):
        m, k = sized(full, smoke)
        cluster_k = min(cluster_k, max_cluster or cluster_k)

        def run():
            rng = np.random.default_rng(m + k)
            x = jnp.asarray(draw(rng, (m, k), BF16, shift=3.0))
            g, b = jnp.asarray(draw(rng, (k,), BF16)), jnp.asarray(draw(rng, (k,), F32))
            b = b if kind == "layer" else None
            outs = {}
            for transport in ("global", "dsmem"):
                try:
                    config = rn.make_config(m, k, BF16, block_m=block_m, cluster_k=cluster_k,
                                            transport=gpu_transport(transport))
                except Skipped:
                    continue
                outs[transport] = rn.row_norm(x, g, b, kind=kind, eps=1e-6, scale_offset=0.0,
                                              config=config, interpret=INTERPRET)
            op = "rms_norm" if kind == "rms" else "layer_norm"
            ratio = max(checks.check_outputs(op, y, x=x, scale=g, bias=b, eps=1e-6)
                        for y in outs.values())
            if len(outs) == 2:
                assert_bitwise(outs["dsmem"], outs["global"], "dsmem vs global")
            return f"err/tol {ratio:.3f}; {' = '.join(outs)} bitwise"

        cases.append(("repeatable", f"row_norm {kind} {m}x{k} cluster {cluster_k}: transports",
                      run))

    row_transports("layer", (64, 8192), (4, 2048), 1, 8)
    row_transports("rms", (256, 8192), (8, 2048), 4, 2)

    def post_transports(kind, full, smoke, residual, bias_mean=0.0,
                        transports=("global", "semaphore", "dsmem"), **changes):
        m, k, n = sized(full, smoke)

        def run():
            rng = np.random.default_rng(m + n + k)
            inputs = op_inputs(rng, f"dense_{kind}_norm", m, k, n, BF16, residual=residual)
            inputs["bias"] = inputs["bias"] + bias_mean
            args = [jnp.asarray(inputs[name]) if inputs.get(name) is not None else None
                    for name in ("x", "kernel", "bias", "scale", "norm_bias", "residual")]
            outs, configs = {}, {}
            for transport in transports:
                try:
                    config = pn.select_config(m, k, n, BF16, kind=kind, residual=residual,
                                              transport=gpu_transport(transport),
                                              max_cluster=max_cluster)
                except Skipped:
                    continue
                if transport == "global":  # one cluster per block: the reference order
                    config = dataclasses.replace(config, grid_clusters=None,
                                                 chain_blocks=False)
                config = dataclasses.replace(config, **changes)
                outs[transport] = pn.post_norm_matmul(*args, kind=kind, eps=1e-6,
                                                      config=config, interpret=INTERPRET)
                configs[transport] = config
            ratio = max(checks.check_outputs(f"dense_{kind}_norm", y_h, **inputs)
                        for y_h in outs.values())
            same = [t for t in outs if t != "global" and same_order(configs[t],
                                                                    configs["global"], kind)]
            if "semaphore" in outs:  # the same tiles' sums
                assert_bitwise(outs["semaphore"][1], outs["global"][1], "h semaphore vs global")
            for t in same:
                assert_bitwise(outs[t][0], outs["global"][0], f"y {t} vs global")
            return f"err/tol {ratio:.3f}; y bitwise: {', '.join(['global', *same])}"

        label = (f"post_norm {kind} {m}x{k}x{n}{' +res' if residual else ''}"
                 f"{' ' + str(changes) if changes else ''}: transports")
        cases.append(("repeatable", label, run))

    post_transports("rms", (2048, 1024, 4096), (128, 64, 512), False)
    post_transports("layer", (4096, 1024, 2048), (192, 64, 256), True, bias_mean=100.0)
    post_transports("rms", (8192, 512, 1024), (128, 64, 256), True)
    post_transports("layer", (4096, 1024, 2048), (256, 64, 512), True, bias_mean=100.0,
                    transports=("global", "semaphore"), tile_m=64, tile_n=256, split_rows=True)

    def gemm_variants():
        m, k, n = sized((2048, 4096, 4096), (130, 128, 256))
        rng = np.random.default_rng(7)
        # The second weight is narrower than the 256-wide CTA tile (on the GPU's pick): its
        # second statistics partial covers no column.
        inputs = dict(x=draw(rng, (m, k), BF16),
                      kernel=[draw(rng, (k, n), BF16, 1 / np.sqrt(k)),
                              draw(rng, (k, 128), BF16, 1 / np.sqrt(k))],
                      bias=[draw(rng, (n,), F32), None], eps=1e-6)
        x, ws = jnp.asarray(inputs["x"]), [jnp.asarray(w) for w in inputs["kernel"]]
        bs = [None if b is None else jnp.asarray(b) for b in inputs["bias"]]
        details = []
        for kind, fn in (("rms", lz.lazy_rms_matmul), ("layer", lz.lazy_layer_norm_matmul)):
            extra = {} if kind == "rms" else dict(prenormalize=False)
            outs, stats = fn(x, ws, biases=bs, return_row_stats=True, interpret=INTERPRET,
                             **extra)
            ratio = checks.check_outputs(f"{kind}_norm_dense", outs, **inputs)
            config = lz.default_config(m, k, [w.shape[1] for w in ws])
            for y, w, (sums, m2s) in zip(outs, ws, stats):
                # (sum, M2) partials of the float32 y, Chan-combined; y was rounded once.
                mean, m2 = row_stats.from_partials(sums, m2s,
                                                   gemm_config.part_columns(w.shape[1], config))
                ratio = max(ratio, vr.check_statistics_of_rounded(y, mean, m2))
            details.append(f"{kind} err/tol {ratio:.3f}")
        (pre,) = lz.lazy_layer_norm_matmul(x, ws[:1], biases=bs[:1], prenormalize=True,
                                           interpret=INTERPRET)
        pre_inputs = {**inputs, "kernel": inputs["kernel"][:1], "bias": inputs["bias"][:1]}
        details.append(f"prenormalized err/tol "
                       f"{checks.check_outputs('layer_norm_dense', [pre], **pre_inputs):.3f}")
        return "; ".join(details) + "; row statistics match y"

    cases.append(("correct", "lazy GEMM: row statistics out, prenormalized LayerNorm",
                  gemm_variants))

    def gain_in_mainloop(m, k, ns, offset, seed):
        def run():
            m_, k_ = sized((m, k), (130, 128))
            ns_ = ns if not SMOKE else tuple(min(n, 128) for n in ns)
            rng = np.random.default_rng(seed)
            inputs = dict(x=draw(rng, (m_, k_), BF16),
                          kernel=[draw(rng, (k_, n), BF16, 1 / np.sqrt(k_)) for n in ns_],
                          scale=draw(rng, (k_,), F32, 0.2, 0.0 if offset else 1.0),
                          scale_offset=offset, eps=1e-6)
            config = dataclasses.replace(lz.default_config(m_, k_, list(ns_)),
                                         cluster_dimension=None, wgmma_in_flight=0)
            kw = dict(scale=jnp.asarray(inputs["scale"]), scale_offset=offset,
                      gain_in_kernel=True, config=config, interpret=INTERPRET)
            x, ws = jnp.asarray(inputs["x"]), [jnp.asarray(w) for w in inputs["kernel"]]
            outs = lz.lazy_rms_matmul(x, ws, **kw)
            ratio = checks.check_outputs("rms_norm_dense", outs, **inputs)
            again = lz.lazy_rms_matmul(x, ws, **kw)
            for a, b in zip(outs, again):
                assert_bitwise(a, b, "gain in the mainloop")
            return f"err/tol {ratio:.3f}; bitwise repeatable"
        return run

    for m, k, ns, offset in (((4096, 2048, (2048, 512, 512), 0.0)),
                             ((2048, 1152, (6912, 6912), 1.0))):
        label = f"lazy GEMM: gain in the mainloop {m}x{k}x{'+'.join(map(str, ns))}"
        cases.append(("correct", label, gain_in_mainloop(m, k, ns, offset, m + k)))
    return cases


def same_order(config: pn.PostNormConfig, reference: pn.PostNormConfig, kind: str) -> bool:
    """Whether two configs combine a row's partials in the same order (so y is bitwise
    equal): the same warpgroup tiles, partials read the same way."""
    same_tiles = (config.tile_m, config.tile_n, config.split_rows) == (
        reference.tile_m, reference.tile_n, reference.split_rows)
    return same_tiles and (pn.row_stats_exchange(config, kind).loads_as_matrix
                           == pn.row_stats_exchange(reference, kind).loads_as_matrix)
