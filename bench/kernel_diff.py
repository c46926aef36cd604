"""`python -m bench.kernel_diff DETAIL_DIR A B`: where two variants' kernel time differs.

`--detail` runs of the model suite write, per variant, every kernel name with its
launches and time per step (`<label>.kernels.json`) and the optimized HLO behind
them (`<label>.hlo.txt`). XLA numbers its fusions per program, so the same fusion
has different names in two variants (`loop_add_fusion.8` in one, `.17` in the
other), and jaxnorm's xla path flattens activations to 2-D where stock Flax keeps
[B, T, D]. This matches kernels by what they compute instead: a fusion's
signature is its kind, its output shape and the multiset of operations inside it,
every shape reduced to its dtype and element count ([2, 1024, 1152] and
[2048, 1152] are one shape, as are the row statistics [2, 1024] and [2048]).
Library kernels (cuBLAS's nvjet/cutlass, Mosaic's) keep their names.

The report lists the signatures whose time differs most, then the totals by
family (the shape a fusion works on: the model's rows, its heads, its MLP), so a
cell's gap reads as "the post-norm statistics took 55 us in 19 launches against
30 us in 12", not as a list of renumbered fusions.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

LIBRARY = re.compile(r"^(nvjet|cutlass|sm90_|sm80_|ampere|cublas|anonymous_mosaic|mosaic)", re.I)
_INSTRUCTION = re.compile(r"^(?:ROOT )?%(\S+) = (.*?) ([a-z][\w-]*)\(")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) \(.*\{\s*$")
_SHAPE = re.compile(r"([a-z]\w*)\[([\d,]*)\]")
_LAYOUT = re.compile(r"\{[^{}]*\}")
_PLUMBING = {"parameter", "constant", "bitcast", "broadcast", "get-tuple-element", "tuple"}

Signature = tuple


def flat_shape(text: str) -> str:
    """Every array shape in `text` as dtype[element count]."""
    def one(m: re.Match) -> str:
        return f"{m.group(1)}[{math.prod(int(d) for d in m.group(2).split(',') if d)}]"
    return _SHAPE.sub(one, _LAYOUT.sub("", text))


def shown_shape(text: str) -> str:
    """`text` without layouts, shapes as HLO writes them (for people)."""
    return _LAYOUT.sub("", text)


@dataclass
class Program:
    """An optimized HLO module: each instruction's (shape, opcode, line), each computation's
    instruction lines."""

    instructions: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    computations: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Program:
        program, current = cls(), None
        for raw in text.splitlines():
            line = raw.strip()
            if (m := _COMPUTATION.match(raw)) and " = " not in raw.split("(")[0]:
                current = m.group(1)
                program.computations[current] = []
                continue
            if current is None or not line.startswith(("%", "ROOT")):
                continue
            program.computations[current].append(line)
            if m := _INSTRUCTION.match(line):
                program.instructions[m.group(1)] = (m.group(2), m.group(3), line)
        return program

    def signature(self, kernel: str) -> tuple[Signature, str]:
        """(what a kernel computes, that in words with its shapes); ("lib", name) for library
        kernels, ("?", name) where the HLO has no instruction of that name."""
        if LIBRARY.match(kernel):
            return ("lib", kernel), kernel
        name = kernel
        if name not in self.instructions:  # CUPTI writes fusion.8 as fusion_8
            name = re.sub(r"_(\d+)$", r".\1", kernel)
        if name not in self.instructions:
            return ("?", kernel), kernel
        shape, opcode, line = self.instructions[name]
        ops: collections.Counter = collections.Counter()
        shown: collections.Counter = collections.Counter()
        called = re.search(r"calls=%([\w.\-]+)", line)
        for inner in self.computations.get(called.group(1), []) if called else []:
            if (m := _INSTRUCTION.match(inner)) and m.group(3) not in _PLUMBING:
                ops[f"{m.group(3)}:{flat_shape(m.group(2))}"] += 1
                shown[f"{m.group(3)}:{shown_shape(m.group(2))}"] += 1
        words = f"{shown_shape(shape)} <- " + " ".join(f"{op}x{n}" for op, n in sorted(shown.items()))
        return (opcode, flat_shape(shape), tuple(sorted(ops.items()))), words


@dataclass
class Row:
    """One signature's launches and time per step, its kernel names, and it in words."""

    launches: int = 0
    us: float = 0.0
    names: list[str] = field(default_factory=list)
    what: str = ""


def by_signature(program: Program, kernels: Iterable[tuple[str, int, float]]
                 ) -> dict[Signature, Row]:
    """Launches and time per step summed per signature (kernels.json rows: name, n, us)."""
    rows: dict[Signature, Row] = collections.defaultdict(Row)
    for name, launches, us in kernels:
        sig, what = program.signature(name)
        row = rows[sig]
        row.what = row.what or what
        row.launches += launches
        row.us += us
        row.names.append(name)
    return dict(rows)


def family(sig: Signature, what: str, families: dict[str, list[str]]) -> str:
    """The first family whose shape patterns occur in the kernel's description; GEMMs and
    library kernels by what they are."""
    if sig[0] == "lib":
        return "mosaic" if "mosaic" in sig[1].lower() else "library gemm"
    text = what
    if "dot:" in text:
        return "xla gemm"
    for name, patterns in families.items():
        if any(p in text for p in patterns):
            return name
    return "other"


def model_families(d_model: int, d_ff: int, head_dim: int, vocab: int) -> dict[str, list[str]]:
    """Shape patterns of a transformer's tensors, checked in this order."""
    return {
        "vocab": [f",{vocab}]", f"[{vocab},"],
        "mlp": [f",{d_ff}]", f",{2 * d_ff}]"],
        "heads": [f",{head_dim}]", f",{head_dim // 2}]"],
        "model rows": [f",{d_model}]", f"[{d_model}]"],
    }


def load(folder: Path, label: str) -> dict[Signature, Row]:
    program = Program.parse((folder / f"{label}.hlo.txt").read_text())
    kernels = json.loads((folder / f"{label}.kernels.json").read_text())["kernels"]
    return by_signature(program, kernels)


def report(a: dict[Signature, Row], b: dict[Signature, Row], names: tuple[str, str],
           families: dict[str, list[str]] | None = None, top: int = 25) -> str:
    """The `top` signatures by |time difference|, then totals by family, as text."""
    keys = set(a) | set(b)
    delta = {k: b.get(k, Row()).us - a.get(k, Row()).us for k in keys}
    lines = [f"{'b - a us':>9}  {names[0]:>16}  {names[1]:>16}  what"]
    for k in sorted(keys, key=lambda k: -abs(delta[k]))[:top]:
        ra, rb = a.get(k, Row()), b.get(k, Row())
        lines.append(f"{delta[k]:9.1f}  {ra.us:9.1f} ({ra.launches:3d})  "
                     f"{rb.us:9.1f} ({rb.launches:3d})  {(ra.what or rb.what)[:160]}")
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0, 0])
    for k in keys:
        ra, rb = a.get(k, Row()), b.get(k, Row())
        t = totals[family(k, ra.what or rb.what, families or {})]
        t[0] += ra.us; t[1] += rb.us; t[2] += ra.launches; t[3] += rb.launches
    lines.append("")
    lines.append(f"{'family':14s} {names[0]:>18} {names[1]:>18} {'b - a':>9}")
    for name, (ua, ub, na, nb) in sorted(totals.items()):
        lines.append(f"{name:14s} {ua:11.1f} ({na:4d}) {ub:11.1f} ({nb:4d}) {ub - ua:9.1f}")
    lines.append(f"{'total':14s} {sum(t[0] for t in totals.values()):11.1f}"
                 f"{'':7s} {sum(t[1] for t in totals.values()):11.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a --detail folder of the model suite")
    parser.add_argument("a", help="label of the first variant, e.g. gemma3-1b-train-stock")
    parser.add_argument("b", help="label of the second, e.g. gemma3-1b-train-jaxnorm")
    parser.add_argument("--model", help="a model suite shape name: group by its tensors")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    families = None
    if args.model:
        from bench.model_suite import SHAPES
        cfg = SHAPES[args.model].cfg
        families = model_families(cfg.d_model, cfg.d_ff, cfg.head_dim, cfg.vocab_size)
    print(report(load(args.folder, args.a), load(args.folder, args.b), (args.a, args.b),
                 families, args.top))


if __name__ == "__main__":
    main()
