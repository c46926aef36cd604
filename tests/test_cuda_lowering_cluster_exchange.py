"""The in-cluster exchanges as lowered for "cuda" (no GPU): the decode kernels' split-K
partials and the row norms' and post-norm GEMM's row statistics (`RowStatsExchange`, DSMEM
transport). Every arrival on a cluster barrier follows a warpgroup barrier after this
warpgroup's last access of the exchanged buffers.

A cluster barrier's arrival is made by one thread per peer CTA (thread 8p of the warpgroup
arrives on rank p's barrier: warps 0 and 1 only; `mgpu.CollectiveBarrierRef.arrive`), and
the thread's own fence orders only its own accesses. Without a warpgroup barrier first, a
peer can see `ready` complete while warps 2 and 3 still store their rows of a partial, or
`free` complete while rank 0's warps 2 and 3 still read its shared memory through DSMEM, and
on the last round exit while they do (an access of an exited CTA's shared memory).

The check walks the Mosaic GPU module in program order: a DSMEM load (`nvvm.mapa`) or a
float32 shared-memory store (the partials, the sums of squares) makes an access pending,
`bar.sync` (a warpgroup barrier) clears it, and no `mbarrier.arrive.shared::cluster` may
meet one pending.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.mosaic.gpu import core as mgpu_core

from pallas_kernels import decode_attention_input as dai
from pallas_kernels import decode_config as dc
from pallas_kernels import decode_gated as dg
from pallas_kernels import decode_matmul as dm
from pallas_kernels import hardware
from pallas_kernels import post_norm_matmul as pn
from pallas_kernels import row_norm as rn

H200 = hardware.h200_mesh()
S = jax.ShapeDtypeStruct
BF16, F32 = jnp.bfloat16, jnp.float32


def _modules(fn, *args) -> list[str]:
    """The Mosaic GPU modules (text) of fn's kernels, lowered for "cuda" on an H200."""
    modules, lower = [], mgpu_core._lower_as_gpu_kernel

    def capture(*a, **kw):
        result = lower(*a, **kw)
        modules.append(str(result[0].operation))
        return result

    mgpu_core._lower_as_gpu_kernel = capture
    try:
        with jax.sharding.use_abstract_mesh(H200):
            jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    finally:
        mgpu_core._lower_as_gpu_kernel = lower
    assert modules
    return modules


def _unsynchronized_arrivals(module: str) -> list[int]:
    """Lines of cluster-barrier arrivals reached with a DSMEM or partial access pending."""
    pending, bad, arrivals = None, [], 0
    for i, line in enumerate(module.splitlines()):
        if "nvvm.mapa" in line or ("mosaic_gpu.vector_store" in line and "xf32" in line):
            pending = i
        elif "bar.sync" in line:
            pending = None
        elif "mbarrier.arrive.shared::cluster" in line:
            arrivals += 1
            if pending is not None:
                bad.append(i)
    assert arrivals, "no cluster-barrier arrival found: the check saw no exchange"
    return bad


def _check(fn, *args) -> None:
    for module in _modules(fn, *args):
        assert not _unsynchronized_arrivals(module)


@pytest.mark.parametrize("m", [8, 64])
@pytest.mark.parametrize("config", [
    dc.DecodeConfig(tile_n=128, split_k=6, stages=7, reduction="cluster"),
    dc.DecodeConfig(tile_n=64, split_k=4, stages=6, warpgroups=2, reduction="cluster")],
    ids=str)
@pytest.mark.parametrize("row_scale_given", [True, False], ids=["given", "in_kernel"])
def test_decode_gemm_exchange_is_synchronized(m, config, row_scale_given):
    k, n = 4096, 2560

    def fn(x, w, r):
        return dm.lazy_rms_decode_matmul(x, [w], row_scale=r if row_scale_given else None,
                                         config=config)

    _check(fn, S((m, k), BF16), S((k, n), BF16), S((m,), F32))


@pytest.mark.parametrize("m", [1, 64])
def test_residual_epilogue_exchange_is_synchronized(m):
    """The bench's one-launch config at 1 x 4096 x 2560: 128-column tiles in clusters of 6."""
    k, n = 4096, 2560
    config = dc.DecodeConfig(tile_n=128, split_k=6, stages=8, reduction="cluster")

    def fn(x, w, r):
        return dm.decode_residual_matmul(x, w, r, config=config)

    _check(fn, S((m, k), BF16), S((k, n), BF16), S((m, n), BF16))


@pytest.mark.parametrize("m", [8, 64])
def test_gated_exchange_is_synchronized(m):
    """Both streams' partials and the sums of squares (the statistic in the kernel)."""
    k, n = 2048, 8192
    config = dc.deepest(dc.DecodeConfig(tile_n=64, split_k=4, reduction="cluster"), 2,
                        streams=2)
    _check(lambda x, wg, wu: dg.decode_gated_rms_matmul(x, wg, wu, activation="silu",
                                                        config=config),
           S((m, k), BF16), S((k, n), BF16), S((k, n), BF16))


@pytest.mark.parametrize("m", [8, 64])
def test_attention_input_exchange_is_synchronized(m):
    """Partials sharing their region with cos/sin: rank 0 reads its peers' whole tiles."""
    d, n_q, n_kv, hd = 1024, 16, 8, 128
    config = dc.deepest(dc.DecodeConfig(tile_n=hd // 2, split_k=4, reduction="cluster"), 2,
                        streams=2, constants=dai.constants_bytes(hd))

    def fn(x, w_q, w_k, w_v, q_gain, k_gain, cos, sin):
        return dai.decode_attention_input(x, (w_q, w_k, w_v), head_dim=hd, q_gain=q_gain,
                                          k_gain=k_gain, cos=cos, sin=sin, qk_offset=0.0,
                                          scale=None, scale_offset=0.0, config=config)

    _check(fn, S((m, d), BF16), S((d, n_q * hd), BF16), S((d, n_kv * hd), BF16),
           S((d, n_kv * hd), BF16), S((hd,), F32), S((hd,), F32), S((m, hd // 2), F32),
           S((m, hd // 2), F32))


@pytest.mark.parametrize("config", [
    rn.RowNormConfig(block_m=1, warps_per_row=4, cluster_k=8, chunk_k=1024, transport="dsmem"),
    rn.RowNormConfig(block_m=4, cluster_k=2, chunk_k=1024, transport="dsmem"),
    rn.RowNormConfig(block_m=2, warps_per_row=2, cluster_k=4, chunk_k=1024, transport="dsmem")],
    ids=["1row-cluster8", "4rows-cluster2", "2rows-cluster4"])
def test_row_norm_exchange_is_synchronized(config):
    """Each CTA stores its partial statistics into every peer's shared memory, then arrives;
    with several row blocks per CTA, peers arrive on `free` after reading them. (Mosaic's
    scalar stores already end in a warpgroup barrier; the exchange no longer relies on it.)"""
    def fn(x):
        return rn.row_norm(x, None, None, kind="layer", eps=1e-6, scale_offset=0.0,
                           config=config)

    _check(fn, S((256, 8192), BF16))


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_post_norm_exchange_is_synchronized(kind):
    """The post-norm GEMM's rows spanning a cluster: statistics exchanged through DSMEM."""
    m, k, n = 4096, 1024, 4096
    config = pn.select_config(m, k, n, BF16, kind=kind, residual=True, transport="dsmem")
    vec = S((n,), F32)

    def fn(x, w, bias, scale, norm_bias, residual):
        return pn.post_norm_matmul(x, w, bias, scale, norm_bias, residual, kind=kind, eps=1e-6,
                                   config=config)

    _check(fn, S((m, k), BF16), S((k, n), BF16), vec, vec, vec if kind == "layer" else None,
           S((m, n), BF16))
