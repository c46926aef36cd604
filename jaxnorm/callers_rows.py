"""x in the caller's shape on the xla path that automatic dispatch falls back to.

The public ops flatten x to [M, K] rows for the kernels. Where impl=None falls back to
xla, the op is stock's graph, and computing it on x in the shape the caller gave
([B, T, K]) makes it stock's graph shape for shape. That matters beyond tidiness: XLA
autotunes each compile's reduction fusions between its native and its Triton emitter,
and a norm-gain gradient over [M, K] rows could land on the Triton one (2.4x slower on the
H200) where stock's over [B, T, K] did not (docs/backward.md, "What moves a training step
between processes").
"""

from __future__ import annotations

from typing import Any

import jax

Lead = tuple[int, ...] | None  # the caller's leading dims; None: the rows as given


def shaped(a: jax.Array | None, lead: Lead) -> jax.Array | None:
    """[M, ...] as [*lead, ...] (None stays None)."""
    return a if a is None or lead is None else a.reshape(*lead, *a.shape[1:])


def flat(a: jax.Array | None, lead: Lead) -> jax.Array | None:
    """[*lead, ...] back to [M, ...] (None stays None)."""
    return a if a is None or lead is None else a.reshape(-1, *a.shape[len(lead):])


def flat_outputs(out: Any, lead: Lead) -> Any:
    """Every array of an op's outputs (arrays [*lead, ...], RowStats of [*lead]) as rows."""
    return out if lead is None else jax.tree.map(lambda a: flat(a, lead), out)
