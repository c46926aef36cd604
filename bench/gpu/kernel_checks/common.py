"""What every GPU kernel check shares: the mode (GPU or SMOKE=1, the interpreter at small
sizes), input draws and bitwise comparison."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

SMOKE = os.environ.get("SMOKE") == "1"
if SMOKE:  # before jax computes anything
    from pallas_kernels.interpreter_flags import use_interpreter_safe_xla_flags

    use_interpreter_safe_xla_flags()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

BF16, F16, F32 = jnp.bfloat16, jnp.float16, jnp.float32
IMPL = "interpret" if SMOKE else "mosaic"
INTERPRET = SMOKE
ALL_CHECKS = ("correct", "NaN isolated", "repeatable")
Case = tuple[str, str, Callable[[], str]]  # (check, label, the check: its detail)


class Skipped(Exception):
    """The check needs the GPU (a transport the interpreter cannot run)."""


def sized(full: tuple[int, ...], smoke: tuple[int, ...]) -> tuple[int, ...]:
    return smoke if SMOKE else full


def draw(rng: np.random.Generator, shape, dtype, scale: float = 1.0, shift: float = 0.0):
    return np.asarray(jnp.asarray(shift + scale * rng.standard_normal(shape), dtype))


def assert_bitwise(a, b, what: str) -> None:
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        u, v = np.asarray(u), np.asarray(v)
        same = (u == v) | (np.isnan(u.astype(np.float32)) & np.isnan(v.astype(np.float32)))
        if not np.all(same):
            where = tuple(int(j) for j in np.argwhere(~same)[0])
            raise AssertionError(f"{what} differs at {where}: {u[where]} vs {v[where]}")


def calls_bitwise_equal(run: Callable[[Any], Any], inputs: Any, calls: int = 20) -> str:
    """`calls` calls of run(inputs) give the same bits as the first (`assert_bitwise`). run
    is jitted once over inputs' arrays (other leaves stay as given): each call then runs
    the compiled kernels, where eager calls re-traced them (about 1 s a call on the H200)."""
    leaves, treedef = jax.tree.flatten(inputs)
    is_array = [isinstance(leaf, (np.ndarray, jax.Array)) for leaf in leaves]

    @jax.jit
    def call(*arrays):
        supply = iter(arrays)
        return run(jax.tree.unflatten(
            treedef, [next(supply) if a else leaf for leaf, a in zip(leaves, is_array)]))

    arrays = [jnp.asarray(leaf) for leaf, a in zip(leaves, is_array) if a]
    first = call(*arrays)
    for i in range(2, calls + 1):
        assert_bitwise(first, call(*arrays), f"call {i}")
    return f"{calls} calls bitwise equal"


def gpu_transport(transport: str) -> str:
    if SMOKE and transport != "global":
        raise Skipped(f"transport={transport!r} runs on the GPU only")
    return transport
