"""Hardware facts the kernels plan with, in one place: the GPU's limits and the interpreter's caps.

Selectors take the SM count as an argument (so that a plan can be made for a GPU
that is not attached); `num_sms` is where a kernel asks for the one it runs on.
"""

from __future__ import annotations

import jax

# The H200 (and H100 SXM): what plans assume where no GPU is attached (lowering for
# "cuda" from a CPU host, and the interpreter, so that a shape gets the same kind of
# config on CPU as on the GPU).
H200_SMS = 132
# Shared memory one CTA may use on Hopper (the opt-in limit, 227 KiB).
SMEM_BYTES_PER_CTA = 227 * 1024
# The portable thread-block cluster size limit.
MAX_CLUSTER = 8
# Clusters of each size that the H200 holds at once: a cluster must fit in one GPC,
# so 16 clusters of 8 do not all fit and the 16th runs after the others. Sizes 1, 2,
# 4 and 8 are measured; 3, 5, 6 and 7 follow from a GPC layout that gives those
# counts (six GPCs of 18 SMs, one of 16, one of 8). docs/mosaic-notes.md, clusters.
H200_RESIDENT_CLUSTERS = {1: 132, 2: 66, 3: 43, 4: 30, 5: 22, 6: 21, 7: 15, 8: 15}

# The interpreter simulates every CTA as a host thread. The persistent GEMM's grid
# takes this many: a few are enough to exercise CTAs that own several tiles.
INTERPRET_GRID_CTAS = 4
# Clusters wider than 2 CTAs were seen to starve the XLA:CPU thread pool that runs
# the interpreter's CTAs and hang on 2-core machines: the kernels are the same, only
# the split is narrower.
INTERPRET_MAX_CLUSTER = 2


def num_sms() -> int:
    """SMs of the GPU the kernels run on: the abstract mesh's device when lowering under one
    that knows its cores, else the attached GPU's, else the H200's (lowering for "cuda" from
    a CPU host, or interpreting inside shard_map over CPU devices)."""
    abstract_device = jax.sharding.get_abstract_mesh().abstract_device
    if abstract_device is not None and abstract_device.num_cores is not None:
        return abstract_device.num_cores
    device = jax.devices()[0]
    if device.platform == "gpu":
        return device.core_count
    return H200_SMS


def resident_clusters(cluster_n: int, sms: int) -> int:
    """Clusters of `cluster_n` CTAs that run at once: a persistent grid must not exceed it,
    or the clusters past it wait for a whole cluster to finish. Measured on the H200;
    elsewhere 7/8 of the SMs' worth, as cluster placement leaves SMs idle."""
    if sms == H200_SMS:
        return H200_RESIDENT_CLUSTERS[cluster_n]
    return max(sms // cluster_n * 7 // 8, 1)


def h200_mesh() -> jax.sharding.AbstractMesh:
    """An abstract mesh of one H200 (`jax.sharding.use_abstract_mesh`): under it a call is
    planned for that GPU on any host, with its SM count (`num_sms`) and, under impl=None,
    the dispatch it would get there (`jaxnorm.dispatch.planned_for_hopper`)."""
    return jax.sharding.AbstractMesh((), (), abstract_device=jax.sharding.AbstractDevice(
        device_kind="H200", platform="gpu", num_cores=H200_SMS))
