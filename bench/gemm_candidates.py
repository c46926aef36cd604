"""The GEMM configs the sweep (bench/gemm_sweep.py) tries, and the names it files them under."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from pallas_kernels import hardware
from pallas_kernels.gemm_config import MatmulDimension, TuningConfig, smem_bytes

M, N = MatmulDimension.M, MatmulDimension.N
# CTA tile -> (tile_m, tile_n, wg_dimension): one MMA warpgroup owns tile_m x tile_n.
CTA_TILES = {
    "128x256": (128, 128, N),
    "128x256/64x256": (64, 256, M),
    "256x128": (128, 128, M),
    "128x128": (128, 64, N),
}
MAX_STEPS = 8
ITEMSIZE = 2  # bf16


def name(config: TuningConfig) -> str:
    """A short unique name: CTA tile/warpgroup tile, K tile, stages, epilogue tile, grid,
    cluster, one wgmma step in flight, pingpong warpgroups."""
    cluster = config.cluster_dimension
    return (f"{config.cta_tile_m}x{config.cta_tile_n}/{config.tile_m}x{config.tile_n}"
            f"_k{config.tile_k}_s{config.max_concurrent_steps}"
            f"_e{config.epi_tile_m}x{config.epi_tile_n}"
            f"_g{config.grid_minor_dim.name}{config.grid_tile_width}"
            + ("" if cluster is None else f"_c{cluster.name}")
            + ("_f1" if config.wgmma_in_flight else "")
            + ("_pp" if config.pingpong else ""))


def fits(config: TuningConfig) -> bool:
    return smem_bytes(config, ITEMSIZE) <= hardware.SMEM_BYTES_PER_CTA


def deepest(config: TuningConfig, min_steps: int = 3) -> TuningConfig | None:
    """`config` with the deepest pipeline (<= MAX_STEPS, >= min_steps) that fits SMEM, or
    None."""
    for steps in range(MAX_STEPS, min_steps - 1, -1):
        fitted = dataclasses.replace(config, max_concurrent_steps=steps)
        if fits(fitted):
            return fitted
    return None


def _unique(configs: Iterable[TuningConfig | None]) -> list[TuningConfig]:
    seen: dict[TuningConfig, None] = {}
    for c in configs:
        if c is not None and fits(c):
            seen.setdefault(c)
    return list(seen)


def screen(clusters: bool = True) -> list[TuningConfig]:
    """Each CTA tile x grid minor dimension x cluster (none, along N, along M; only none
    without `clusters`); grid tile width 8, deepest pipeline, 64x64 epilogue tile."""
    return _unique(
        deepest(TuningConfig(tile_m=tm, tile_n=tn, wg_dimension=wg, grid_minor_dim=minor,
                             grid_tile_width=8, cluster_dimension=cluster))
        for tm, tn, wg in CTA_TILES.values()
        for minor in (M, N)
        for cluster in ((None, N, M) if clusters else (None,))
    )


def refinements(config: TuningConfig) -> list[TuningConfig]:
    """One knob changed at a time: grid tile width 4 and 16, 4 stages (with a half-width
    epilogue tile where that is what fits, as `gemm_config.default_config` does), a 64x128
    epilogue tile."""
    wide_epilogue = None
    if config.tile_n % 128 == 0:
        wide_epilogue = deepest(dataclasses.replace(config, epi_tile_n=128))
    four = dataclasses.replace(config, max_concurrent_steps=4)
    if not fits(four):
        four = dataclasses.replace(four, epi_tile_n=config.epi_tile_n // 2)
    variants = [
        dataclasses.replace(config, grid_tile_width=4),
        dataclasses.replace(config, grid_tile_width=16),
        four,
        wide_epilogue,
    ]
    return [c for c in _unique(variants) if c != config]


def in_flight_variants(config: TuningConfig) -> list[TuningConfig]:
    """`config` with one wgmma step in flight, as is and with a stage more where a half-width
    epilogue tile makes room for it (the step in flight holds a slot the TMA could fill)."""
    lagged = dataclasses.replace(config, wgmma_in_flight=1)
    deeper = dataclasses.replace(lagged, max_concurrent_steps=config.max_concurrent_steps + 1)
    if not fits(deeper) and config.epi_tile_n > 32:
        deeper = dataclasses.replace(deeper, epi_tile_n=config.epi_tile_n // 2)
    return _unique([lagged, deeper if deeper.max_concurrent_steps <= MAX_STEPS else None])


# Warpgroup tiles of the pingpong candidates: each MMA warpgroup owns a whole CTA tile.
PINGPONG_TILES = ((128, 128), (64, 256))


def pingpong_variants(config: TuningConfig) -> list[TuningConfig]:
    """Pingpong warpgroups (`TuningConfig.pingpong`) at PINGPONG_TILES with `config`'s grid
    order, no cluster, each with the deepest ring (>= 2 slots) that fits, waiting on every
    K step's wgmmas or leaving one in flight (only one warpgroup is in its mainloop at a
    time, so a wait per step idles the tensor cores)."""
    out = []
    for tile_m, tile_n in PINGPONG_TILES:
        for in_flight in (0, 1):
            base = dataclasses.replace(config, tile_m=tile_m, tile_n=tile_n, pingpong=True,
                                       cluster_dimension=None, wgmma_in_flight=in_flight,
                                       epi_tile_m=min(config.epi_tile_m, tile_m),
                                       epi_tile_n=min(config.epi_tile_n, tile_n))
            out.append(deepest(base, min_steps=2))
    return _unique(out)
