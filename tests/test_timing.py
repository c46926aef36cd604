"""bench/timing.py on CPU: the program each measurement runs (CUPTI itself needs a GPU)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from bench import timing


def _traced_fn():
    traces = []

    def fn(x, y):
        traces.append(x.shape)
        return (x * y).sum()

    return fn, traces


def test_one_copy_is_one_program_for_wall_and_kernel_time():
    """A single set (a whole model) is traced and compiled once: the CUPTI stage profiles the
    program the wall samples ran, not a second program around it."""
    fn, traces = _traced_fn()
    args = (jnp.arange(6.0), jnp.ones(6))
    t = timing.measure(fn, [args], repeats=2, warmup=1)
    assert len(traces) == 1
    assert t.copies == 1 and len(t.wall_samples_us) == 2
    hlo = timing.measured_hlo(fn, [args])
    assert hlo.startswith("HloModule") and len(traces) == 1


def test_rotated_copies_are_timed_together():
    """Several copies: CUPTI times one program over all of them (fn traced once per copy
    inside it, after the per-call program)."""
    fn, traces = _traced_fn()
    rng = np.random.default_rng(0)
    sets = [(jnp.asarray(rng.standard_normal(4)), jnp.asarray(rng.standard_normal(4)))
            for _ in range(2)]
    t = timing.measure(fn, sets, repeats=2, warmup=0)
    assert t.copies == 2 and len(traces) == 1 + 2
