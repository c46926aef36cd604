"""`python -m bench.decode_plan --model M --batch B`: what a jitted decode step launches, on CPU.

The model suite counts a decode step's kernels on the H200 (CUPTI). This lowers the same
step (`bench.model_suite.decode_steps`: DECODE_STEPS greedy steps in one lax.scan) for
"cuda" on any host, dispatched as on the H200 (an abstract H200 mesh:
`jaxnorm.dispatch.planned_for_hopper`, `pallas_kernels.hardware.num_sms`), and reads the
lowered program:

- the Mosaic launches per step and per layer, each named by the jaxnorm backend that
  issued it and its kernel module (from the lowered call sites);
- whatever would run on the host or leave the stream: host callbacks, infeed, outfeed,
  send and recv, and every custom call that is not a Mosaic kernel, for jaxnorm and for
  stock Flax (none expected in either);
- why each op's calls that stayed on XLA did (every distinct reason in this step's trace,
  `jaxnorm.dispatch.recorded_choices`), and which were declined for want of a
  measurement rather than for a measured loss: what to measure next.

XLA's own fusions are only known once XLA compiles for the GPU, so the kernel count per
layer with them stays the model suite's (bench/model_suite.py, `kernels`).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from bench import model_suite
from jaxnorm import dispatch, models
from pallas_kernels import hardware

H200 = hardware.h200_mesh()
MOSAIC_TARGET = "mosaic_gpu_v2"
_CUSTOM_CALL = re.compile(r"stablehlo\.custom_call @([\w.$-]+)\(.*loc\((#loc\d+)\)\s*$", re.M)
_LOC = re.compile(r"^(#loc\d+) = (.*)$", re.M)
_HOST_OPS = re.compile(r"\bstablehlo\.(infeed|outfeed|send|recv)\b")
_HOST_TARGET = re.compile(r"callback|host", re.I)
_UNMEASURED = re.compile(r"no measured shape")
_FRAME = re.compile(r'loc\("([\w<>.]+)"\(loc\("[^"]*/(jaxnorm/backends|pallas_kernels)/(\w+)\.py"')


def _expanded(ref: str, locs: dict[str, str], depth: int = 0) -> str:
    """A location with the #locN references inside it replaced by their definitions."""
    text = locs.get(ref, ref)
    if depth > 32:
        return text
    return re.sub(r"#loc\d+", lambda m: _expanded(m.group(0), locs, depth + 1), text)


def _launch_label(location: str) -> str:
    """"op (kernel module)" of a Mosaic call site: the outermost backend function (the
    registered op) and the innermost kernel module of its frames."""
    frames = _FRAME.findall(location)
    backends = [fn for fn, where, _ in frames if where == "jaxnorm/backends"]
    kernel = next((module for _, where, module in frames if where == "pallas_kernels"), "?")
    return f"{backends[-1] if backends else '?'} ({kernel})"


def read_lowered(text: str) -> dict[str, Any]:
    """Mosaic launches by label, other custom-call targets, and host work in a lowered
    program's text (`as_text(debug_info=True)`)."""
    locs = dict(_LOC.findall(text))
    mosaic: collections.Counter[str] = collections.Counter()
    others: collections.Counter[str] = collections.Counter()
    for target, ref in _CUSTOM_CALL.findall(text):
        if target == MOSAIC_TARGET:
            mosaic[_launch_label(_expanded(ref, locs))] += 1
        else:
            others[target] += 1
    host = sorted({t for t in others if _HOST_TARGET.search(t)} | set(_HOST_OPS.findall(text)))
    return {"mosaic": dict(mosaic), "other_custom_calls": dict(others), "host_work": host}


def lowered_decode_step(shape: model_suite.ModelShape, batch: int, *, fused: bool) -> str:
    """The decode step of `shape` (jaxnorm with `fused`, else stock Flax) lowered for "cuda"
    as the H200 would dispatch it, from abstract parameters and cache (nothing allocated)."""
    cfg = shape.cfg.replace(fused=fused, impl=None)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: models.Transformer(cfg,
                                                                          rngs=nnx.Rngs(0))))
    kv = jax.ShapeDtypeStruct(cfg.cache_shape(batch, shape.cache), cfg.dtype)
    cache = tuple((kv, kv) for _ in range(cfg.n_layers))
    token = jax.ShapeDtypeStruct((batch,), jnp.int32)
    with jax.sharding.use_abstract_mesh(H200):
        traced = jax.jit(model_suite.decode_steps(graphdef, shape)).trace(state, token, cache)
        return traced.lower(lowering_platforms=("cuda",)).as_text(debug_info=True)


def plan(shape: model_suite.ModelShape, batch: int) -> dict[str, Any]:
    """One decode cell's launch plan: jaxnorm's Mosaic launches per step and per layer by
    label, its fallback reasons, and host work of jaxnorm and of stock Flax."""
    with dispatch.recorded_choices() as choices:
        fused = read_lowered(lowered_decode_step(shape, batch, fused=True))
    reasons = {op: [why for impl, why in made if impl == "xla"] for op, made in choices.items()}
    reasons = {op: whys for op, whys in reasons.items() if whys}
    stock = read_lowered(lowered_decode_step(shape, batch, fused=False))
    per_step = sum(fused["mosaic"].values())
    return {
        "model": shape.name, "batch": batch, "layers": shape.cfg.n_layers,
        "mosaic_per_step": per_step, "mosaic_per_layer": per_step / shape.cfg.n_layers,
        "mosaic": fused["mosaic"], "fallbacks": reasons,
        # Declined for want of a measurement, not for a measured loss: what to measure next.
        "unmeasured": sorted(op for op, whys in reasons.items()
                             if any(_UNMEASURED.search(why) for why in whys)),
        "host_work": {"jaxnorm": fused["host_work"], "stock": stock["host_work"]},
        "other_custom_calls": {"jaxnorm": fused["other_custom_calls"],
                               "stock": stock["other_custom_calls"]},
    }


def report(plans: list[dict[str, Any]]) -> str:
    """The plans as Markdown: one row per cell, then each cell's launches by label."""
    lines = ["| model | B | Mosaic launches per step | per layer | host work (jaxnorm, stock) "
             "| declined, not measured |", "|---|---:|---:|---:|---|---|"]
    for p in plans:
        host = ", ".join(" ".join(p["host_work"][v]) or "none" for v in ("jaxnorm", "stock"))
        lines.append(f"| {p['model']} | {p['batch']} | {p['mosaic_per_step']} | "
                     f"{p['mosaic_per_layer']:g} | {host} | {', '.join(p['unmeasured'])} |")
    for p in plans:
        lines += ["", f"{p['model']} B={p['batch']}:"]
        lines += [f"- {label}: {n}" for label, n in sorted(p["mosaic"].items())] or ["- none"]
        lines += [f"- on xla, {op}: {why}" for op, whys in sorted(p["fallbacks"].items())
                  for why in whys]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-0.6b",
                        help=f"comma-separated presets: {', '.join(model_suite.SHAPES)}")
    parser.add_argument("--batch", default="1,8,64", help="comma-separated decode batches")
    parser.add_argument("--out", type=Path, help="also write decode-plan.json there")
    args = parser.parse_args(argv)
    names = args.model.split(",")
    if unknown := [n for n in names if n not in model_suite.SHAPES]:
        parser.error(f"unknown presets {unknown}; choose from {list(model_suite.SHAPES)}")
    plans = []
    for name in names:
        for batch in (int(b) for b in args.batch.split(",")):
            print(f"lowering {name} decode B={batch} for cuda ...", flush=True)
            plans.append(plan(model_suite.SHAPES[name], batch))
    print(report(plans), end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "decode-plan.json").write_text(json.dumps(plans, indent=1))


if __name__ == "__main__":
    main()
