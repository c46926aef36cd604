"""bench/timing.py on CPU: which program each measurement runs. CUPTI needs a GPU, so its
profiler is replaced by a recorder that returns one kernel per call."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.mosaic.gpu import profiler

from bench import timing


@pytest.fixture
def profiled(monkeypatch):
    """The programs handed to CUPTI, each timed as one 2 ms kernel per iteration."""
    programs = []

    def measure(program, *, aggregate, iterations):
        programs.append(program)
        return lambda *args: (program(*args), [[("k", 2.0)]] * iterations)

    monkeypatch.setattr(profiler, "measure", measure)
    return programs


def _traced_fn():
    traces = []

    def fn(x, y):
        traces.append(x.shape)
        return (x * y).sum()

    return fn, traces


def test_one_copy_is_one_program_for_wall_and_kernel_time(profiled):
    """A single set (a whole model) is traced and compiled once: CUPTI profiles the program
    the wall samples ran, not a second program around it."""
    fn, traces = _traced_fn()
    t = timing.measure(fn, [(jnp.arange(6.0), jnp.ones(6))], repeats=2, warmup=1)
    assert profiled == [timing._jitted(fn)] and len(traces) == 1
    assert t.copies == 1 and t.kernel_us == 2000.0 and len(t.wall_samples_us) == 2
    assert timing.measured_hlo(fn, [(jnp.arange(6.0), jnp.ones(6))]).startswith("HloModule")
    assert len(traces) == 1


def test_rotated_copies_are_timed_together(profiled):
    """Several copies: CUPTI times one program over all of them, the kernel time divided
    by the copy count."""
    fn, traces = _traced_fn()
    rng = np.random.default_rng(0)
    sets = [(jnp.asarray(rng.standard_normal(4)), jnp.asarray(rng.standard_normal(4)))
            for _ in range(2)]
    t = timing.measure(fn, sets, repeats=2, warmup=0)
    assert profiled == [timing._run_all(fn)] and len(traces) == 1
    assert t.copies == 2 and t.kernel_us == 1000.0


@pytest.mark.parametrize("set_mb", [1.5, 2.4, 4.2, 12.6, 45.0, 200.0, 4000.0])
def test_rotated_copies_stream_from_hbm(set_mb, monkeypatch):
    """Decode launches' sets of a few megabytes get copies that together cover 3x L2, so no
    copy is still in L2 when it comes round again; sets larger than that get 2."""
    assert timing.rotation_copies(int(set_mb * 2**20)) == 1  # no GPU here: nothing to defeat
    monkeypatch.setattr(timing.jax, "default_backend", lambda: "gpu")
    set_bytes = int(set_mb * 2**20)
    copies = timing.rotation_copies(set_bytes)
    assert copies * set_bytes >= 3 * timing.L2_BYTES
    assert copies == max(2, -(-3 * timing.L2_BYTES // set_bytes))


def test_interleaved_wall_takes_one_sample_of_each_program_per_pass(monkeypatch):
    """After each program's compile and warm-up, the samples alternate A, B, A, B: sample i
    of one and of the other come from the same pass; measure(wall=) keeps them."""
    fa, _ = _traced_fn()
    fb, _ = _traced_fn()
    args = [(jnp.arange(4.0), jnp.ones(4))]
    calls = []
    real = timing._wall_samples

    def recording(fn, arg_sets, repeats):
        calls.append((fn, repeats))
        return real(fn, arg_sets, repeats)

    monkeypatch.setattr(timing, "_wall_samples", recording)
    walls = timing.interleaved_wall({"a": (fa, args), "b": (fb, args)}, repeats=3, warmup=2)
    ja, jb = timing._jitted(fa), timing._jitted(fb)
    assert calls == [(ja, 2), (jb, 2)] + [(ja, 1), (jb, 1)] * 3
    assert [len(w.samples_us) for w in walls.values()] == [3, 3]
    calls.clear()
    t = timing.measure(fa, args, repeats=3, wall=walls["a"])
    assert calls == [] and t.wall_samples_us == walls["a"].samples_us
