"""The XLA:CPU setting the Pallas GPU interpreter needs; apply before jax's first computation.

The interpreter runs each warpgroup as a thread whose kernel body is one jitted
computation of host callbacks (barrier waits, shared-memory stores). With
XLA:CPU's concurrency-optimized scheduler (jax 0.11.2) correct kernels hung
there: two warpgroups waited on barriers forever while the others sat in XLA
without a running callback (docs/mosaic-notes.md). With the scheduler off the
same runs finish, race-free and correct.
"""

from __future__ import annotations

import os

FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def use_interpreter_safe_xla_flags() -> None:
    """Add FLAG to XLA_FLAGS. XLA reads them when jax creates its CPU client (the first
    computation), so call this before that; later it has no effect."""
    flags = os.environ.get("XLA_FLAGS", "")
    if FLAG not in flags.split():
        os.environ["XLA_FLAGS"] = f"{flags} {FLAG}".strip()
