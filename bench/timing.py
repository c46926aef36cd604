"""Timing one call on the GPU: CUPTI kernel time and wall time, inputs rotated.

Weights must stream from HBM as they do in a model, so each measurement
cycles through copies of its inputs that together are at least three times the L2
cache (`rotation_copies`; the H200's L2 is 60 MB): a decode launch's few megabytes of
weights take dozens of copies. (Before 2026-12-05 the count was capped at 4, so sets
under 45 MB, most decode launches of the 1B-class presets, were timed with their
weights partly or wholly in L2.) A single set that alone exceeds that (a whole
model's weights and cache) is timed as one copy: then the wall samples and CUPTI time
one program, and it compiles once. Copies are one jitted function called on each
set, so however many there are, fn is traced and its kernels lowered once. Medians
over repeats, after warm-up.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax

L2_BYTES = 60 * 2**20
# 3x L2 for sets of 1.5 MB and up (the presets' smallest decode launch, Gemma-3-1B's
# o-projection, is 2.4 MB of weights).
MAX_COPIES = 128
# CUPTI's measure keeps every iteration's outputs alive until it returns; the
# largest cases write gigabytes per call, so fewer iterations for them.
CUPTI_OUTPUT_BUDGET = 16 * 2**30

Args = tuple[jax.Array, ...]


def rotation_copies(
    set_bytes: int, *, l2_bytes: int = L2_BYTES, max_copies: int = MAX_COPIES
) -> int:
    """Copies so that all of them together are >= 3x L2 (at least 2, at most `max_copies`):
    a set reused before 3x L2 of other data has streamed would be read partly from L2.
    One where JAX's backend is not a GPU (CPU runs exercise the code, they time nothing)."""
    if jax.default_backend() != "gpu":
        return 1
    return max(2, min(max_copies, math.ceil(3 * l2_bytes / max(set_bytes, 1))))


@dataclass(frozen=True)
class Timing:
    """Medians and raw samples of one measured call, in microseconds."""

    wall_us: float
    kernel_us: float | None
    wall_samples_us: list[float]
    kernel_samples_us: list[float]
    kernels: list[tuple[str, float]] = field(default_factory=list)
    """(name, us / copies) of every kernel one iteration over all copies launched (CUPTI),
    in launch order: summed, one call's kernel time (XLA may interleave the copies'
    kernels, so no slice of the list is one copy's)."""
    copies: int = 1
    rotation_bytes: int = 0
    cupti_error: str | None = None
    first_call_s: float = 0.0
    """Seconds of the first call of every copy: compiling, where this process had not yet."""

    @property
    def best_us(self) -> float:
        """Kernel time where CUPTI worked, else wall time."""
        return self.kernel_us if self.kernel_us is not None else self.wall_us


def _wall_samples(fn: Callable[..., Any], arg_sets: Sequence[Args], repeats: int) -> list[float]:
    samples = []
    for i in range(repeats):
        args = arg_sets[i % len(arg_sets)]
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


@functools.lru_cache(maxsize=64)
def _run_all(fn: Callable[..., Any]) -> Callable[..., Any]:
    """One jitted call of fn over every copy; cached so repeated measures of fn compile once.
    Each copy calls the same jitted fn, which JAX traces and lowers once for all of them."""
    jitted = _jitted(fn)
    return jax.jit(lambda sets: [jitted(*args) for args in sets])


def measured_hlo(fn: Callable[..., Any], arg_sets: Sequence[Args]) -> str:
    """XLA's optimized HLO of the program `measure` times with CUPTI (fn over every copy in
    one call, or fn itself for one copy): its fusion names are the kernel names CUPTI
    reports."""
    if len(arg_sets) == 1:
        return _jitted(fn).lower(*arg_sets[0]).compile().as_text()
    return _run_all(fn).lower(list(arg_sets)).compile().as_text()


@functools.lru_cache(maxsize=64)
def _jitted(fn: Callable[..., Any]) -> Callable[..., Any]:
    return jax.jit(fn)


def _cupti(
    fn: Callable[..., Any], arg_sets: Sequence[Args], repeats: int
) -> tuple[list[float], list[tuple[str, float]], str | None]:
    """Kernel time per call: one jitted call runs fn on every copy (fn's own program for one
    copy, the one the wall samples ran), CUPTI sums its kernels."""
    try:
        from jax.experimental.mosaic.gpu import profiler
    except ImportError as err:
        return [], [], f"profiler unavailable: {err}"
    if len(arg_sets) == 1:
        program, args = _jitted(fn), tuple(arg_sets[0])
    else:
        program, args = _run_all(fn), (list(arg_sets),)
    outputs = jax.tree.leaves(jax.eval_shape(program, *args))
    out_bytes = sum(o.size * o.dtype.itemsize for o in outputs)
    # At least 2: measure returns one flat list, not a list per iteration, for 1.
    iterations = max(2, min(repeats, CUPTI_OUTPUT_BUDGET // max(out_bytes, 1)))
    try:
        _, per_iteration = profiler.measure(program, aggregate=False, iterations=iterations)(
            *args
        )
    except Exception as err:  # CUPTI missing or refusing: keep wall time, say why
        return [], [], f"{type(err).__name__}: {err}"
    if per_iteration is None:
        return [], [], "CUPTI recorded no kernels"
    copies = len(arg_sets)
    samples = [sum(ms for _, ms in it) * 1e3 / copies for it in per_iteration]
    kernels = [(name, ms * 1e3 / copies) for name, ms in per_iteration[0]]
    return samples, kernels, None


@dataclass(frozen=True)
class Wall:
    """One program's wall samples (us) from `interleaved_wall`, and its first calls' seconds."""

    samples_us: list[float]
    first_call_s: float


def _first_calls(jitted: Callable[..., Any], arg_sets: Sequence[Args]) -> float:
    """Seconds to compile (where this process had not) and touch every copy once."""
    start = time.perf_counter()
    for args in arg_sets:
        jax.block_until_ready(jitted(*args))
    return time.perf_counter() - start


def interleaved_wall(programs: Mapping[str, tuple[Callable[..., Any], Sequence[Args]]], *,
                     repeats: int, warmup: int = 3) -> dict[str, Wall]:
    """Wall samples of several programs (label -> (fn, arg_sets)) taken in turn, one sample
    of each per pass, so that drift over the passes (clocks, power, the allocator) falls on
    all of them alike and sample i of one pairs with sample i of another. Each fn is
    compiled and warmed up first; `measure(..., wall=)` then reuses the compilation."""
    jitted = {label: _jitted(fn) for label, (fn, _) in programs.items()}
    first = {label: _first_calls(jitted[label], sets) for label, (_, sets) in programs.items()}
    for label, (_, sets) in programs.items():
        _wall_samples(jitted[label], sets, warmup)
    samples: dict[str, list[float]] = {label: [] for label in programs}
    for i in range(repeats):
        for label, (_, sets) in programs.items():
            samples[label] += _wall_samples(jitted[label], [sets[i % len(sets)]], 1)
    return {label: Wall(samples[label], first[label]) for label in programs}


def paired_quartiles(samples_us: Sequence[float],
                     reference_us: Sequence[float]) -> tuple[float, float, float]:
    """(lower quartile, median, upper quartile) of sample i / reference sample i: two
    programs' `interleaved_wall` samples, paired by pass."""
    ratios = [a / b for a, b in zip(samples_us, reference_us)]
    if len(ratios) == 1:
        return ratios[0], ratios[0], ratios[0]
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return q1, median, q3


def measure(
    fn: Callable[..., Any], arg_sets: Sequence[Args], *, repeats: int = 30, warmup: int = 3,
    wall: Wall | None = None,
) -> Timing:
    """Time `fn(*args)` over rotating `arg_sets` (each a full set of inputs); with `wall`
    (from `interleaved_wall`), those wall samples instead of taking its own."""
    jitted = _jitted(fn)
    if wall is None:
        first_call_s = _first_calls(jitted, arg_sets)  # compile, and touch every copy once
        _wall_samples(jitted, arg_sets, warmup)
        samples = _wall_samples(jitted, arg_sets, repeats)
    else:
        samples, first_call_s = wall.samples_us, wall.first_call_s
    kernel, kernels, error = _cupti(fn, arg_sets, repeats)
    return Timing(
        wall_us=statistics.median(samples),
        kernel_us=statistics.median(kernel) if kernel else None,
        wall_samples_us=samples,
        kernel_samples_us=kernel,
        kernels=kernels,
        copies=len(arg_sets),
        rotation_bytes=sum(a.nbytes for a in jax.tree.leaves(arg_sets)),
        cupti_error=error,
        first_call_s=first_call_s,
    )
