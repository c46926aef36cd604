"""Per-row statistics of a row split across CTAs: the partials, their combine, their exchange.

docs/design.md, the statistics combine: when a row is split across CTAs, each CTA
(and each warpgroup inside it that owns part of the row) reduces its part to a few
float32 numbers per row, the *partials*: RMSNorm a sum of squares; LayerNorm
(shift, shifted mean, M2), Chan-combined, so rows with |mean| >> std keep their
digits. Only the partials move; every party then holds every partial and combines
them itself (`combine_rms`, `combine_layer`), so no second round trip is needed.

Three transports, one interface (`RowStatsExchange.all_gather`, or `publish` then
`collect`): "dsmem" (the GPU path: each party pushes its partials into every CTA's
shared memory with remote stores, then arrives on every CTA's cluster barrier),
"global" (what the Pallas GPU interpreter runs: global scratch and the cluster
barrier) and "semaphore" (GPU only: the CTAs sharing a row block are a group of a
persistent grid, signalling a global counter). Memory ordering, the repeated
exchanges of persistent kernels and why each transport is built as it is:
docs/mosaic-notes.md, row-statistics exchange.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax
from jax.experimental.mosaic.gpu import utils as mgpu_utils

Transport = Literal["dsmem", "global", "semaphore"]
Kind = Literal["rms", "layer"]


# ---------------------------------------------------------------- the statistics


def safe_rsqrt(v: jax.Array) -> jax.Array:
    """rsqrt(v) for v > 0, 0 for v == 0 (a zero row with eps = 0 gives zeros), NaN stays NaN."""
    positive = v > 0
    return jnp.where(positive, lax.rsqrt(jnp.where(positive, v, 1.0)), jnp.where(v != v, v, 0.0))


def num_stats(kind: Kind) -> int:
    """float32 numbers per row in one partial: a sum of squares, or (shift, mean, M2)."""
    return 1 if kind == "rms" else 3


def combine_rms(partial: Callable[[int, int], jax.Array], num_partials: int, k: int,
                eps: float) -> jax.Array:
    """rsqrt(mean(x^2) + eps) per row from partial sums of squares (stat 0)."""
    total = partial(0, 0)
    for p in range(1, num_partials):
        total = total + partial(p, 0)
    return safe_rsqrt(total * (1.0 / k) + eps)


def combine_layer(
    partial: Callable[[int, int], jax.Array], num_partials: int, count: int, eps: float
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(s_0, mu, 1/std) per row from Chan partials (shift, shifted mean, M2), `count` each.

    The row mean is s_0 + mu; normalize as ((x - s_0) - mu) * inv_std.
    """
    shift0 = partial(0, 0)
    means = [(partial(p, 0) - shift0) + partial(p, 1) for p in range(num_partials)]
    mu = means[0]
    for a in means[1:]:
        mu = mu + a
    mu = mu * (1.0 / num_partials)
    m2 = partial(0, 2)
    for p in range(1, num_partials):
        m2 = m2 + partial(p, 2)
    spread = (means[0] - mu) * (means[0] - mu)
    for a in means[1:]:
        spread = spread + (a - mu) * (a - mu)
    m2 = m2 + spread * float(count)
    return shift0, mu, safe_rsqrt(m2 * (1.0 / (count * num_partials)) + eps)


def combine_rms_matrix(sums_of_squares: jax.Array, k: int, eps: float) -> jax.Array:
    """combine_rms from a [rows, partials] matrix of partial sums of squares."""
    return safe_rsqrt(jnp.sum(sums_of_squares, axis=1) * (1.0 / k) + eps)


def combine_layer_matrix(
    shift: jax.Array, mean_d: jax.Array, m2: jax.Array, count: int, eps: float,
    along_rows: Callable[[jax.Array], jax.Array],
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """combine_layer from [rows, partials] matrices of Chan partials, `count` each; the
    reference shift s_0 is the partials' mean shift. `along_rows` broadcasts a [rows]
    vector to the matrices' shape (and layout)."""
    parts = shift.shape[1]
    shift0 = jnp.sum(shift, axis=1) * (1.0 / parts)
    means = (shift - along_rows(shift0)) + mean_d
    mu = jnp.sum(means, axis=1) * (1.0 / parts)
    spread = means - along_rows(mu)
    m2 = jnp.sum(m2, axis=1) + jnp.sum(spread * spread, axis=1) * float(count)
    return shift0, mu, safe_rsqrt(m2 * (1.0 / (count * parts)) + eps)


# ------------------------------------------------------------------ the exchange


class ExchangeScratch(NamedTuple):
    """Shared-memory refs of one exchange; build with `RowStatsExchange.smem_scratch`."""

    # [num_partials, num_stats, >= rows] float32: every party's partials ("dsmem", or a
    # one-CTA cluster; the transports through global memory read them in place: None)
    gathered: Any
    barrier: Any  # cluster barrier (or a CTA barrier when the cluster has one CTA)
    free: Any  # every party is done reading: a cluster barrier (repeated "dsmem"), else None


class Site(NamedTuple):
    """Where one party exchanges.

    Attributes:
      party: the warpgroup's index among the CTA's parties.
      cluster_id: the slot of its row block in the global scratch.
      round_index: how many exchanges this CTA made before (repeated exchanges).
      semaphores: the "semaphore" transport's semaphores (`semaphores()`), else None.
      group: the CTA's group index along the grid axis groups are laid out on.
    """

    party: jax.Array | int
    cluster_id: jax.Array | int
    round_index: jax.Array | int = 0
    semaphores: Any = None
    group: jax.Array | int = 0


@dataclasses.dataclass(frozen=True)
class RowStatsExchange:
    """Who exchanges what: `parties` warpgroups in each of `cluster_size` CTAs.

    Attributes:
      axis: the cluster axis name of the kernel (`cluster_names`).
      cluster_size: CTAs along `axis`; 1 means a purely local exchange.
      parties: warpgroups per CTA that each contribute one partial.
      num_stats: float32 numbers per row in one partial.
      rows: rows covered by one partial.
      transport: "dsmem" (GPU cluster), "global" (interpreter, or GPU fallback) or
        "semaphore" (GPU grid group).
      gpu_fences: emit the memory fences (False under the interpreter).
      repeated: the kernel exchanges once per row block, several times per CTA.
      row_split: the parties of a CTA own disjoint `rows`-row ranges (party p rows
        [p * rows, (p + 1) * rows)) instead of the same rows, so a row has one partial
        per CTA; each party waits only for those that share its rows.
    """

    axis: str
    cluster_size: int
    parties: int
    num_stats: int
    rows: int
    transport: Transport
    gpu_fences: bool
    repeated: bool = False
    row_split: bool = False

    def __post_init__(self) -> None:
        if self.transport not in ("dsmem", "global", "semaphore"):
            raise ValueError(
                f"transport must be 'dsmem', 'global' or 'semaphore'; got {self.transport!r}")
        if self.cluster_size < 1 or self.parties < 1:
            raise ValueError(f"cluster_size and parties must be >= 1; got {self}")

    @property
    def num_partials(self) -> int:
        """Partials of one row: one per party that covers it."""
        return self.cluster_size * (1 if self.row_split else self.parties)

    @property
    def _row_sets(self) -> int:
        """Parties of a CTA with rows of their own."""
        return self.parties if self.row_split else 1

    def _slot(self, rank, party):
        return rank if self.row_split else rank * self.parties + party

    def _first_row(self, party):
        return party * self.rows if self.row_split else 0

    @property
    def _padded_rows(self) -> int:
        # Copies into shared memory move multiples of 128 bytes (one arrival per
        # thread of the warpgroup) and TMA strides are multiples of 16 bytes: pad
        # each stat to 32 floats. Rows past `rows` are never written nor read.
        return -(-self.rows * self._row_sets // 32) * 32

    @property
    def _via_global(self) -> bool:
        # A one-CTA "cluster" exchanges through its own shared memory either way.
        return self.transport in ("global", "semaphore") and self.cluster_size > 1

    @property
    def gathered_in_global(self) -> bool:
        """`collect` returns the global scratch, which Mosaic GPU loads from only with
        `plgpu.load(..., optimized=False)` (its optimized transfers are to SMEM)."""
        return self._via_global

    @property
    def loads_as_matrix(self) -> bool:
        """Readers load a row's partials as one [rows, partials] matrix (`load_partials_matrix`):
        they lie side by side in global memory, and the WGMMA layout takes 8 columns at a
        time. Otherwise partial by partial (`load_partial`)."""
        return self._via_global and self.num_partials % 8 == 0

    def _partial_index(self, p, j: int, rows: Any) -> tuple:
        """Where stat j of partial p lies for `rows`: [stat, row, partial] in global
        memory (a row's partials side by side), [partial, stat, row] in shared memory."""
        return (j, rows, p) if self._via_global else (p, j, rows)

    def load_partial(self, gathered: Any, rows: int, layout: Any, p: int, j: int) -> jax.Array:
        """Stat j of partial p for the first `rows` rows in `layout` (a scalar for one-row
        blocks), from the buffer `collect` returned."""
        stat = gathered.at[self._partial_index(p, j, slice(None))]
        if rows == 1:
            return stat[0]
        return plgpu.load(stat.at[pl.ds(0, rows)], layout=layout,
                          optimized=not self.gathered_in_global)

    def load_partials_matrix(self, gathered: Any, j: int) -> jax.Array:
        """Stat j of every partial as one [rows, partials] float32 array in the WGMMA layout,
        from the global scratch `collect` returned (`loads_as_matrix`)."""
        if not self.loads_as_matrix:
            raise ValueError(f"partials load one by one here ({self.transport!r}, "
                             f"{self.num_partials} partials)")
        return plgpu.load(gathered.at[j], layout=plgpu.Layout.WGMMA, optimized=False)

    @property
    def _via_semaphores(self) -> bool:
        return self.transport == "semaphore" and self.cluster_size > 1

    @property
    def _needs_free(self) -> bool:
        return self.repeated and self.cluster_size > 1 and not self._via_global

    def smem_scratch(self) -> ExchangeScratch:
        """Allocations to pass in `scratch_types` / `pl.run_scoped` (shared by the parties)."""
        stats = (self.num_stats, self._padded_rows)
        if self._via_semaphores:
            barrier = None
        elif self.cluster_size > 1:
            barrier = plgpu.ClusterBarrier(collective_axes=(self.axis,), num_arrivals=self.parties)
        else:
            barrier = plgpu.Barrier(num_arrivals=self.parties)
        free = None
        if self._needs_free:
            free = plgpu.ClusterBarrier(collective_axes=(self.axis,), num_arrivals=self.parties)
        gathered = None
        if not self._via_global:
            gathered = plgpu.SMEM((self.num_partials, *stats), jnp.float32)
        return ExchangeScratch(gathered=gathered, barrier=barrier, free=free)

    def gmem_scratch(self, num_clusters: int) -> jax.ShapeDtypeStruct | None:
        """The extra kernel output the "global" transport writes partials to (else None)."""
        if not self._via_global:
            return None
        shape = (num_clusters, self.num_stats, self._padded_rows, self.num_partials)
        return jax.ShapeDtypeStruct(shape, jnp.float32)

    def semaphores(self, num_groups: int) -> Any:
        """The "semaphore" transport's global semaphores (call inside the kernel), else None:
        one counter per group (per group and party with `row_split`), which jax zero-fills
        before every call."""
        if not self._via_semaphores:
            return None
        return pl.get_global(plgpu.SemaphoreType.REGULAR((num_groups * self._row_sets,)))

    def _counter(self, semaphores: Any, group, party) -> Any:
        return semaphores.at[group * self._row_sets + party if self.row_split else group]

    def all_gather(
        self,
        partials: Sequence[jax.Array],
        scratch: ExchangeScratch,
        gmem_scratch: Any,
        site: Site,
    ) -> Any:
        """Publish this party's `partials` (num_stats arrays of [rows], or scalars when
        rows == 1); wait for everyone's; return the buffer that holds them.

        Read stat j of partial p, where p = rank_in_cluster * parties + party,
        with `load_partial` (or all partials at once with `load_partials_matrix`).
        With `repeated`, `site.round_index` counts the exchanges this CTA made
        before; call `release` once done reading the partials and `finish`
        before exiting.
        """
        self.publish(partials, scratch, gmem_scratch, site)
        return self.collect(scratch, gmem_scratch, site)

    def publish(
        self,
        partials: Sequence[jax.Array],
        scratch: ExchangeScratch,
        gmem_scratch: Any,
        site: Site,
    ) -> None:
        """Send this party's partials of round `site.round_index` and signal them; no
        waiting on peers (the caller may do other work before `collect`)."""
        party, cluster_id, round_index, semaphores, group = site
        if len(partials) != self.num_stats:
            raise ValueError(f"expected {self.num_stats} partial statistics, got {len(partials)}")
        rank = jax.lax.axis_index(self.axis) if self.cluster_size > 1 else 0
        slot, first_row = self._slot(rank, party), self._first_row(party)
        if self._via_global:
            self._store_partials(gmem_scratch.at[cluster_id], slot, first_row, partials)
        else:
            if self._needs_free:
                # Every peer must be done reading the previous round.
                if isinstance(round_index, int):
                    if round_index:
                        self._wait_free(scratch)()
                else:
                    pl.when(round_index > 0)(self._wait_free(scratch))
            self._publish_dsmem(partials, scratch, slot, first_row)
        if self._via_semaphores:
            _signal_released(self._counter(semaphores, group, party), fence=self.gpu_fences)
        else:
            self._release_to_cluster()
            plgpu.barrier_arrive(scratch.barrier)

    def collect(
        self,
        scratch: ExchangeScratch,
        gmem_scratch: Any,
        site: Site,
    ) -> Any:
        """Wait for every party's partials of round `site.round_index`; return the buffer
        that holds them (as from `all_gather`): shared memory, or the global scratch
        for the transports through global memory; with `row_split`, a view of this
        party's rows."""
        party, cluster_id, round_index, semaphores, group = site
        if self._via_semaphores:
            # The counter only grows: once it holds num_partials * (r + 1), every party
            # sharing these rows has published round r (none publishes round r + 1 before
            # it sees that). One thread polls, fences (acquire, GPU scope), then the
            # warpgroup meets.
            plgpu.semaphore_wait(self._counter(semaphores, group, party),
                                 self.num_partials * (round_index + 1),
                                 decrement=False, memory_scope="gpu")
        else:
            plgpu.barrier_wait(scratch.barrier)
            if self.gpu_fences and self.cluster_size > 1:
                ptx_fence("fence.acq_rel.cluster;")
        gathered = gmem_scratch.at[cluster_id] if self._via_global else scratch.gathered
        if self.row_split:
            rows = pl.ds(self._first_row(party), self.rows)
            return gathered.at[:, rows] if self._via_global else gathered.at[:, :, rows]
        return gathered

    def release(self, scratch: ExchangeScratch) -> None:
        """This party is done reading `gathered` (repeated DSMEM exchanges only)."""
        if not self._needs_free:
            return
        self._release_to_cluster()
        plgpu.barrier_arrive(scratch.free)

    def _release_to_cluster(self) -> None:
        """Before arriving on a cluster barrier: the cluster fence, then a warpgroup barrier.
        The arrival is one thread per peer CTA (`mgpu.CollectiveBarrierRef.arrive`), whose
        fence orders only its own accesses, so without the barrier a peer could see the
        phase complete while other warps still store their partials into its shared memory
        or read `gathered` (tests/test_cuda_lowering_cluster_exchange.py)."""
        if self.gpu_fences and self.cluster_size > 1:
            ptx_fence("fence.acq_rel.cluster;")
            warpgroup_barrier()

    def finish(self, scratch: ExchangeScratch, rounds: jax.Array) -> None:
        """Observe the last round's releases, so no peer arrives on an exited CTA."""
        if self._needs_free:
            pl.when(rounds > 0)(self._wait_free(scratch))

    def _wait_free(self, scratch: ExchangeScratch):
        def wait() -> None:
            plgpu.barrier_wait(scratch.free)
            if self.gpu_fences:  # peers are other CTAs of the cluster
                ptx_fence("fence.acq_rel.cluster;")

        return wait

    def _publish_dsmem(self, partials: Sequence[jax.Array], scratch: ExchangeScratch, slot,
                       first_row) -> None:
        for peer in range(self.cluster_size):
            target = scratch.gathered
            if self.cluster_size > 1:
                target = plgpu.cluster_ref(target, {self.axis: peer})
            self._store_partials(target, slot, first_row, partials)

    def _store_partials(self, ref: Any, slot, first_row, partials: Sequence[jax.Array]) -> None:
        """Stat j of partial `slot` = partials[j] over the rows from `first_row`, for every
        stat j, where `_partial_index` puts it; a scalar (a one-row block's stat) fills
        row 0."""
        for j, value in enumerate(partials):
            rows = 0 if value.ndim == 0 else pl.ds(first_row, value.shape[0])
            ref[self._partial_index(slot, j, rows)] = value


def _signal_released(semaphore: Any, *, fence: bool) -> None:
    """Release the warpgroup's prior writes to whoever waits on `semaphore`: the
    warpgroup meets at a barrier, then one thread fences (fence.acq_rel.gpu, if
    `fence`) and adds 1 with a relaxed GPU-scope reduction.

    jax 0.11.2's `plgpu.semaphore_signal_parallel` emits a system-scope fence
    after every signal instead: on the H200 that cost 11-41 us per exchange
    round for groups of 4-16 CTAs, most of the group kernel's loss then.
    """
    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))
    def emit(_ctx, ref):
        mgpu_utils.warpgroup_barrier()  # every thread's partials are stored
        one_thread = mgpu_utils.single_thread_predicate(mgpu_utils.ThreadSubset.WARPGROUP)
        if fence:
            mgpu_utils.inline_ptx("fence.acq_rel.gpu;", predicate=one_thread,
                                  has_side_effects=True)
        mgpu_utils.SemaphoreRef(mgpu_utils.memref_ptr(ref)).signal(
            1, predicate=one_thread, relaxed=True, memory_scope="gpu")

    emit(semaphore)


def warpgroup_barrier() -> None:
    """Mosaic GPU's barrier of this warpgroup's 128 threads (bar.sync)."""
    @plgpu.inline_mgpu()
    def emit(_ctx):
        mgpu_utils.warpgroup_barrier()

    emit()


def ptx_fence(ptx: str) -> None:
    """Emit one PTX fence instruction (e.g. "fence.acq_rel.cluster;") for the warpgroup."""
    @plgpu.inline_mgpu()
    def emit(_ctx):
        mgpu_utils.inline_ptx(ptx, has_side_effects=True)

    emit()
