"""Knobs, shape checks and per-shape selection of the decode kernels (decode_matmul, decode_gated).

At decode (M <= 64) a GEMM only streams weights: the time is the weight bytes over
the bandwidth the SMs pull together. `decode_config` picks the tiles and the
K split with a model of that (`modelled_seconds`): every SM's share of the work
units, each SM's rate capped by its bytes in flight (stages x weight tile over a
load latency) and by its wgmma time, the HBM bandwidth shared among the SMs still
busy, plus the split-K reduction's traffic and launch. The model's constants are not
measurements; where bench/decode_gemm.py has measured a nearby shape on this GPU, its
fastest config (pallas_kernels/decode_configs.py) is taken instead.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import jax
import jax.experimental.pallas as pl

from pallas_kernels import decode_configs, gemm_config, hardware
from pallas_kernels.errors import Unsupported

# The rows of one wgmma (and of the x tile): decode's M is padded to it by TMA zero-fill.
MAX_ROWS = 64
# Output staging pieces: 64 columns of x.dtype, 32 of float32 (each 128 bytes a row).
EPI_N = {2: 64, 4: 32}

# Model constants (H200; bench/decode_gemm.py measures what replaces them).
HBM_BYTES_PER_S = 4.0e12
LOAD_LATENCY_S = 1.5e-6
SM_PORT_BYTES_PER_S = 40e9
SM_TENSOR_FLOPS = 0.6 * 990e12 / hardware.H200_SMS
# Kernel time of the XLA fusion that sums split-K partials (a small kernel's floor).
REDUCE_LAUNCH_S = 2e-6
# One in-cluster exchange of split-K partials (`reduction="cluster"`): two cluster barriers
# and rank 0's reads of its peers' [64, tile_n] float32 tiles through DSMEM.
CLUSTER_EXCHANGE_S = 1e-6

# Who sums split-K partials: one XLA fusion after the kernel ("xla"), or the kernel itself,
# the splits of a tile being one thread-block cluster ("cluster").
Reduction = Literal["xla", "cluster"]


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Tiles and schedule: each MMA warpgroup owns a [64, tile_n] float32 accumulator.

    A work unit is (weight, N tile of warpgroups * tile_n columns, K split). With
    `split_k` = 1 the epilogue runs in the kernel; with `split_k` = S > 1 the S splits
    of a tile write float32 partials that one XLA fusion sums (`reduction="xla"`), or
    they are one cluster of S CTAs whose rank 0 sums them and runs the epilogue
    (`reduction="cluster"`, S <= 8: no second kernel). `stages` pipeline slots of
    [64, tile_k] x and [tile_k, warpgroups * tile_n] weight tiles.
    """

    tile_n: int = 128
    tile_k: int = 64
    split_k: int = 1
    stages: int = 8
    warpgroups: int = 1
    reduction: Reduction = "xla"

    @property
    def cta_tile_n(self) -> int:
        return self.tile_n * self.warpgroups

    @property
    def cluster_splits(self) -> bool:
        """The K splits of a tile are one cluster that reduces in the kernel."""
        return self.split_k > 1 and self.reduction == "cluster"

    @property
    def partials_out(self) -> bool:
        """The kernel writes float32 split-K partials for XLA to sum."""
        return self.split_k > 1 and self.reduction == "xla"


def epi_tile_n(config: DecodeConfig, itemsize: int) -> int:
    """Columns of one output staging piece: float32 partials or x.dtype outputs."""
    return EPI_N[4] if config.partials_out else EPI_N[itemsize]


def cluster_partial_bytes(config: DecodeConfig, streams: int = 1) -> int:
    """Shared memory of a cluster rank's split-K partials, one [64, tile_n] float32 tile per
    stream and MMA warpgroup (and a [64] sum of squares each), that rank 0 reads through
    DSMEM, and its two cluster barriers (1 KiB with alignment) (`reduction="cluster"`);
    else 0."""
    if not config.cluster_splits:
        return 0
    return config.warpgroups * MAX_ROWS * (streams * config.tile_n + 1) * 4 + 1024


def smem_bytes(config: DecodeConfig, itemsize: int, streams: int = 1, extra: int = 0,
               constants: int = 0) -> int:
    """Pipeline slots (x and `streams` weight tiles), output staging (two pieces per
    warpgroup), the row scale, the double-buffered bias tiles, barriers, `extra` bytes of an
    epilogue's own, and `constants` bytes of `decode_kernel.Plan.constants`, which in a
    cluster share their memory with the split-K partials (rank 0 holds only the former,
    ranks 1..S-1 only the latter)."""
    stage = (MAX_ROWS + streams * config.cta_tile_n) * config.tile_k * itemsize
    out_itemsize = 4 if config.partials_out else itemsize
    out = config.warpgroups * 2 * MAX_ROWS * epi_tile_n(config, itemsize) * out_itemsize
    vectors = 4 * (MAX_ROWS + 2 * streams * config.cta_tile_n)
    return (stage * config.stages + out + vectors + 512
            + max(cluster_partial_bytes(config, streams), constants) + extra)


def check_shapes(
    x: jax.ShapeDtypeStruct | jax.Array,
    weights: Sequence[jax.ShapeDtypeStruct | jax.Array],
    config: DecodeConfig,
    streams: int = 1,
    extra: int = 0,
    constants: int = 0,
) -> None:
    """Raise Unsupported naming the argument and the limit (what the decode kernel does not serve).

    x and the weights as the lazy GEMM takes them (2-D, bf16/f16, K and every N
    multiples of 64, one dtype), then the decode limits: M <= 64 and the knobs
    (the SMEM of `streams` weight tiles per pipeline slot).
    """
    gemm_config.check_shapes(x, weights, gemm_config.TuningConfig(tile_m=64, tile_n=64))
    m, k = x.shape
    if m > MAX_ROWS:
        raise Unsupported(f"M={m} must be in [1, {MAX_ROWS}] for the decode GEMM")
    if config.tile_k != 64:
        raise Unsupported(f"tile_k={config.tile_k} must be 64 (one 128-byte swizzle of x)")
    if config.tile_n % 64 or not 64 <= config.tile_n <= 256:
        raise Unsupported(f"tile_n={config.tile_n} must be a multiple of 64 in [64, 256]")
    if config.warpgroups not in (1, 2):
        raise Unsupported(f"warpgroups={config.warpgroups} must be 1 or 2")
    if not 1 <= config.split_k <= k // config.tile_k:
        raise Unsupported(
            f"split_k={config.split_k} must be in [1, K / tile_k = {k // config.tile_k}]"
        )
    if config.stages < 2:
        raise Unsupported(f"stages={config.stages} must be >= 2")
    if config.reduction not in ("xla", "cluster"):
        raise ValueError(f"reduction must be 'xla' or 'cluster'; got {config.reduction!r}")
    if config.cluster_splits and config.split_k > hardware.MAX_CLUSTER:
        raise Unsupported(f"split_k={config.split_k} must be <= {hardware.MAX_CLUSTER} (the "
                          "portable cluster size) to reduce in the cluster")
    if smem_bytes(config, x.dtype.itemsize, streams, extra,
                  constants) > hardware.SMEM_BYTES_PER_CTA:
        raise Unsupported(f"{config} needs more shared memory than a CTA has")


def units(config: DecodeConfig, ns: Sequence[int]) -> int:
    """Work units of one launch: (weight, N tile, K split)."""
    return sum(pl.cdiv(n, config.cta_tile_n) for n in ns) * config.split_k


def one_wave_cluster_split(tiles: int, k_iters: int, sms: int,
                           limit: int = hardware.MAX_CLUSTER) -> int | None:
    """The cluster width S (2..limit, at most the K steps) that puts the most CTAs to work
    while all `tiles` clusters run at once (tiles <= `hardware.resident_clusters(S)`), or
    None where none does. A cluster per tile that must wait for a whole cluster to finish
    runs the launch in two rounds: on the H200 that doubled the kernel (bench.decode_gemm,
    docs/mosaic-notes.md)."""
    fitting = [s for s in range(2, min(limit, k_iters) + 1)
               if tiles <= hardware.resident_clusters(s, sms)]
    return max(fitting, default=None)


def split_bounds(split: int, k_iters: int, split_k: int) -> tuple[int, int]:
    """K steps [lo, hi) of one split: sizes differ by at most one step."""
    return split * k_iters // split_k, (split + 1) * k_iters // split_k


def _busy_seconds(works: list[float], rate_cap: float) -> float:
    """When the last SM finishes: each busy SM pulls min(rate_cap, HBM / busy SMs) bytes/s."""
    time, done, left = 0.0, 0.0, sorted(works)
    for i, work in enumerate(left):
        busy = len(left) - i
        rate = min(rate_cap, HBM_BYTES_PER_S / busy)
        time += (work - done) / rate
        done = work
    return time


def modelled_seconds(config: DecodeConfig, m: int, k: int, ns: Sequence[int], *, sms: int,
                     itemsize: int = 2, streams: int = 1) -> float:
    """The model's kernel time of one launch (plus the split-K reduction), in seconds;
    `streams` weights of [K, N_i] each per output (2: the gated kernel's gate and up)."""
    k_iters = k // config.tile_k
    step_bytes = streams * config.tile_k * config.cta_tile_n * itemsize
    n_units = units(config, ns)
    works = [0.0] * min(sms, n_units)
    for u in range(n_units):
        lo, hi = split_bounds(u % config.split_k, k_iters, config.split_k)
        works[u % sms] += (hi - lo) * step_bytes
    mma_seconds = 2 * streams * MAX_ROWS * config.cta_tile_n * config.tile_k / SM_TENSOR_FLOPS
    rate_cap = min(SM_PORT_BYTES_PER_S, config.stages * step_bytes / LOAD_LATENCY_S,
                   step_bytes / mma_seconds)
    seconds = _busy_seconds(works, rate_cap)
    if config.cluster_splits:
        clusters = min(hardware.resident_clusters(config.split_k, sms), n_units // config.split_k)
        seconds += -(-n_units // (config.split_k * clusters)) * CLUSTER_EXCHANGE_S
    elif config.split_k > 1:
        partials = config.split_k * m * sum(ns) * 4
        seconds += (2 * partials + m * sum(ns) * itemsize) / HBM_BYTES_PER_S + REDUCE_LAUNCH_S
    return seconds


def deepest(config: DecodeConfig, itemsize: int, max_stages: int = 12,
            streams: int = 1, extra: int = 0, constants: int = 0) -> DecodeConfig:
    """`config` with the most pipeline stages (<= max_stages) that fit in shared memory."""
    for stages in range(max_stages, 1, -1):
        fitted = dataclasses.replace(config, stages=stages)
        if smem_bytes(fitted, itemsize, streams, extra,
                      constants) <= hardware.SMEM_BYTES_PER_CTA:
            return fitted
    raise Unsupported(f"{config}: not even two stages fit in shared memory")


# A measured entry serves launches within this distance of its shape in log2(M, K, total N):
# a factor of 2 along one dimension. M counts as itself, not as its x box: cuBLAS, the
# entry's comparator, changes algorithm with M (at M = 1 XLA turns the dot into a reduction).
TABLE_RADIUS_LOG2 = 1.0


class MeasuredEntry(NamedTuple):
    shape: tuple[int, int, tuple[int, ...]]  # (M, K, (N_i...))
    config: DecodeConfig
    ratio_to_cublas: float


def measured_entry(m: int, k: int, ns: Sequence[int], *, sms: int,
                   itemsize: int = 2) -> MeasuredEntry | None:
    """The table entry (pallas_kernels/decode_configs.py) nearest the launch in log2(M, K,
    total N), if within TABLE_RADIUS_LOG2, measured on a GPU of `sms` SMs in 2-byte types,
    and valid for this launch's K; else None.

    Only entries of at most as many weights count, the same count first: an entry's ratio is
    against one cuBLAS dot per weight, so one measured with more weights than this launch
    would credit it with dots its stock version does not run."""
    if itemsize != 2 or not decode_configs.ENTRIES or decode_configs.PROVENANCE.get("sms") != sms:
        return None
    here = [math.log2(d) for d in (m, k, sum(ns))]

    def distance(entry) -> float:
        (em, ek, ens), _, _ = entry
        return math.dist(here, [math.log2(d) for d in (em, ek, sum(ens))])

    near = [e for e in decode_configs.ENTRIES
            if len(e[0][2]) <= len(ns) and distance(e) <= TABLE_RADIUS_LOG2]
    if not near:
        return None
    shape, fields, ratio = min(near, key=lambda e: (len(e[0][2]) != len(ns), distance(e)))
    config = fitting_config(fields, k)
    return None if config is None else MeasuredEntry(shape, config, ratio)


def fitting_config(fields: dict | None, k: int) -> DecodeConfig | None:
    """A measured table entry's config fields as a DecodeConfig, where its K split fits this
    launch's K (a nearby entry may split more ways than K has steps); else None."""
    if fields is None:
        return None
    config = DecodeConfig(**fields)
    return config if config.split_k <= k // config.tile_k else None


def decode_config(
    m: int, k: int, ns: Sequence[int], *, sms: int = hardware.H200_SMS, itemsize: int = 2
) -> DecodeConfig:
    """The config for an [m, k] x [k, N_i] launch (M <= 64): the measured table's nearest
    entry (`measured_entry`), else the modelled-fastest.

    Model candidates: one warpgroup with 64-, 128- or 256-column tiles, K split 1..16
    ways, each with the deepest pipeline that fits. Ties go to fewer splits.
    """
    entry = measured_entry(m, k, ns, sms=sms, itemsize=itemsize)
    if entry is not None:
        return entry.config
    return _decode_config(m, k, tuple(ns), sms, itemsize)


@functools.lru_cache(maxsize=256)
def _decode_config(m: int, k: int, ns: tuple[int, ...], sms: int, itemsize: int) -> DecodeConfig:
    k_iters = k // 64
    best, best_seconds = None, float("inf")
    for tile_n in (64, 128, 256):
        for split_k in range(1, min(16, k_iters) + 1):
            config = deepest(DecodeConfig(tile_n=tile_n, split_k=split_k), itemsize)
            seconds = modelled_seconds(config, m, k, ns, sms=sms, itemsize=itemsize)
            if seconds < best_seconds * 0.999:
                best, best_seconds = config, seconds
    if best is None:
        raise Unsupported(f"K={k} must be a multiple of 64")
    return best


# The gated kernel's candidates (tile_n, warpgroups): two [64, tile_n] float32 accumulators per
# MMA warpgroup cap tile_n at 128 (128 registers a thread, beside the row statistic's 32).
GATED_TILES = ((64, 1), (128, 1), (64, 2), (128, 2))


def gated_decode_config(m: int, k: int, n: int, *, sms: int = hardware.H200_SMS,
                        itemsize: int = 2) -> DecodeConfig:
    """The modelled-fastest config of the decode gated kernel (gate and up [K, n], M <= 64).

    split_k is 1: act(gate) * up is not linear in K's partial sums. Candidates are
    GATED_TILES, each with the deepest pipeline of x and both weight tiles that fits;
    ties go to the earlier (narrower) one, whose units spread over more SMs.
    """
    return _gated_decode_config(m, k, n, sms, itemsize)


@functools.lru_cache(maxsize=256)
def _gated_decode_config(m: int, k: int, n: int, sms: int, itemsize: int) -> DecodeConfig:
    best, best_seconds = None, float("inf")
    for tile_n, warpgroups in GATED_TILES:
        config = deepest(DecodeConfig(tile_n=tile_n, warpgroups=warpgroups), itemsize,
                         streams=2)
        seconds = modelled_seconds(config, m, k, (n,), sms=sms, itemsize=itemsize, streams=2)
        if seconds < best_seconds * 0.999:
            best, best_seconds = config, seconds
    return best
