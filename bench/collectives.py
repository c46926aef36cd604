"""The collectives of a compiled XLA program, read from its HLO text: kind, shapes, bytes.

What a sharded computation moves between devices is in the partitioned HLO
(`jax.jit(f).lower(*args).compile().as_text()`): every all-reduce, all-gather,
reduce-scatter, all-to-all and collective-permute with its result shapes. The
sharding tests assert on these (no all-gather of x) and `bench/multi_gpu.py`
reports them next to the timings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_INSTRUCTION = re.compile(
    r"=\s*(?P<type>\([^()]*\)|[a-z]+\d*\[[\d,]*\](?:\{[^}]*\})?)\s+"
    r"(?P<kind>" + "|".join(KINDS) + r")(?:-start)?\(")
_ARRAY = re.compile(r"(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
             "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}


@dataclass(frozen=True)
class Collective:
    """One collective instruction: its kind and the (dtype, shape) of each array it returns."""

    kind: str
    arrays: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def bytes(self) -> int:
        """Bytes of its result per device (an all-reduce's buffer, an all-gather's output)."""
        return sum(_ITEMSIZE[d] * int(np.prod(s, dtype=np.int64)) for d, s in self.arrays)

    def describe(self) -> str:
        shapes = ", ".join(f"{d}[{','.join(map(str, s))}]" for d, s in self.arrays)
        return f"{self.kind} {shapes} ({self.bytes} B)"


def collectives(hlo_text: str) -> list[Collective]:
    """Every collective in compiled HLO text, in program order (async pairs counted once)."""
    found = []
    for match in _INSTRUCTION.finditer(hlo_text):
        arrays = tuple(
            (a["dtype"], tuple(int(d) for d in a["dims"].split(",") if d))
            for a in _ARRAY.finditer(match["type"]))
        if match["kind"] in ("all-gather", "reduce-scatter", "collective-permute") and \
                match["type"].startswith("("):
            arrays = arrays[len(arrays) // 2:]  # async start: (operands, results)
        found.append(Collective(match["kind"], arrays))
    return found


def compiled_collectives(fn, *args) -> list[Collective]:
    """The collectives of `jax.jit(fn)` compiled for `args` (already placed or sharded)."""
    import jax

    return collectives(jax.jit(fn).lower(*args).compile().as_text())
