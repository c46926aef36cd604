"""What a function's jaxpr computes, counted: for tests that two paths build the same graph."""

from __future__ import annotations

import collections
from collections.abc import Callable

import jax
import jax.extend
from jax._src.interpreters import partial_eval as pe


def primitive_counts(fn: Callable, *args, dce: bool = True) -> collections.Counter:
    """How often each primitive occurs in fn's jaxpr (nested jaxprs included), after
    dead-code elimination of the outer jaxpr unless `dce=False`."""
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    if dce:
        jaxpr, _ = pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))

    def count(j) -> collections.Counter:
        total = collections.Counter(e.primitive.name for e in j.eqns)
        for e in j.eqns:
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                total += count(sub)
        return total
    return count(jaxpr)
