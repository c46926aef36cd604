"""A ping-pong K-loop: two MMA warpgroups take turns on whole output tiles (Hopper).

In the cooperative K-loop (`plgpu.emit_pipeline_warp_specialized`) both MMA
warpgroups share every tile, so both run the epilogue at the same time while
the tensor cores idle. Here the TMA warpgroup streams the K steps of a CTA's
tiles, in order, through one ring of shared-memory stages, and MMA warpgroup
w takes the CTA's tiles w, w + 2, w + 4, ...: one warpgroup's epilogue runs
under the other's K-loop, as in CUTLASS's ping-pong Hopper GEMMs. The tensor
cores take the two K-loops in turn without an explicit order barrier: tile
t + 1's stages are loaded only as tile t's are released.

Barriers: `full[w, slot]` (TMA landed, waited by warpgroup w only) and
`empty[slot]` (released by whichever warpgroup read it, waited by the TMA
warpgroup). Each warpgroup has its own `full` barriers because a barrier's
phase is tracked by each waiting thread: a warpgroup that skipped the other's
steps on a shared barrier would lose count of its phases.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

MMA_WARPGROUPS = 2
# Registers per thread: 2 x 232 (MMA) + 40 (TMA) = 504 <= 512.
_MMA_REGISTERS = 232
_TMA_REGISTERS = 40


@dataclasses.dataclass(frozen=True)
class PingPongRing:
    """The ring of K-step stages: x [tile_m, tile_k] and w [tile_k, tile_n] per stage."""

    tile_m: int
    tile_n: int
    tile_k: int
    stages: int
    dtype: Any

    def stage_bytes(self) -> int:
        return (self.tile_m + self.tile_n) * self.tile_k * jnp.dtype(self.dtype).itemsize

    def allocations(self) -> dict[str, Any]:
        """Pass to `pl.run_scoped(..., collective_axes=<warpgroup axis>)`."""
        itemsize = jnp.dtype(self.dtype).itemsize
        swizzle = plgpu.find_swizzle(self.tile_k * itemsize * 8)
        transforms = (plgpu.TilingTransform((8, swizzle // itemsize)),
                      plgpu.SwizzleTransform(swizzle))
        return dict(
            x_ring=plgpu.SMEM((self.stages, self.tile_m, self.tile_k), self.dtype,
                              transforms=transforms),
            w_ring=plgpu.SMEM((self.stages, self.tile_k, self.tile_n), self.dtype,
                              transforms=transforms),
            full=plgpu.Barrier(num_arrivals=2, num_barriers=MMA_WARPGROUPS * self.stages),
            empty=plgpu.Barrier(num_arrivals=1, num_barriers=self.stages),
        )

    def produce(self, ring: dict[str, Any], x_gmem: Any, w_gmem: Any, *, num_tiles: jax.Array,
                tile_rows: Callable[[jax.Array], pl.Slice], cols: pl.Slice, k: int) -> None:
        """The TMA warpgroup: every K step of the CTA's `num_tiles` tiles, in order."""
        plgpu.set_max_registers(_TMA_REGISTERS, action="decrease")
        k_steps = k // self.tile_k
        total = num_tiles * k_steps

        @pl.loop(0, total)
        def _step(step):
            tile, kk = lax.div(step, k_steps), lax.rem(step, k_steps)
            slot = lax.rem(step, self.stages)

            # The slot's previous fill must have been read (the first fills need no wait).
            @pl.when(step >= self.stages)
            def _():
                plgpu.barrier_wait(ring["empty"].at[slot])

            full = ring["full"].at[lax.rem(tile, MMA_WARPGROUPS) * self.stages + slot]
            k_slice = pl.ds(kk * self.tile_k, self.tile_k)
            plgpu.copy_gmem_to_smem(x_gmem.at[tile_rows(tile), k_slice], ring["x_ring"].at[slot],
                                    full)
            plgpu.copy_gmem_to_smem(w_gmem.at[k_slice, cols], ring["w_ring"].at[slot], full)

        # Observe the last releases, so no barrier phase is left pending at exit.
        @pl.loop(jnp.maximum(total - self.stages, 0), total)
        def _drain(step):
            plgpu.barrier_wait(ring["empty"].at[lax.rem(step, self.stages)])

    def enter_mma(self) -> None:
        """An MMA warpgroup takes the registers the TMA warpgroup gave up."""
        plgpu.set_max_registers(_MMA_REGISTERS, action="increase")

    def accumulate(self, ring: dict[str, Any], acc_ref: Any, *, wg: int, tile: jax.Array,
                   k: int) -> None:
        """MMA warpgroup `wg`: acc_ref += x @ w over the K steps of the CTA's tile `tile`.

        One wgmma stays in flight across steps; a stage is released once the
        wgmma after the one that read it has been issued and the reader waited for.
        """
        k_steps = k // self.tile_k
        first = tile * k_steps

        def slot_of(step):
            return lax.rem(step, self.stages)

        @pl.loop(0, k_steps)
        def _k(kk):
            step = first + kk
            slot = slot_of(step)
            plgpu.barrier_wait(ring["full"].at[wg * self.stages + slot])
            plgpu.wgmma(acc_ref, ring["x_ring"].at[slot], ring["w_ring"].at[slot])
            plgpu.wgmma_wait(1)

            @pl.when(kk > 0)
            def _release_previous():
                plgpu.barrier_arrive(ring["empty"].at[slot_of(step - 1)])

        plgpu.wgmma_wait(0)
        plgpu.barrier_arrive(ring["empty"].at[slot_of(first + k_steps - 1)])


def tiles_of_warpgroup(num_tiles: jax.Array, wg: int) -> jax.Array:
    """How many of the CTA's `num_tiles` tiles MMA warpgroup `wg` takes (tiles wg, wg + 2, ...)."""
    return lax.div(num_tiles - wg + MMA_WARPGROUPS - 1, MMA_WARPGROUPS)
