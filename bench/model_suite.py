"""`python -m bench --suite model`: the model is the truth.

Real model dimensions with few layers, three phases (prefill forward, a
training step with an optax update, a greedy decode step over a KV cache of
4096), four variants built from the same parameters and measured interleaved
in one process, two rounds, the order rotated by one each round:

- stock: `jaxnorm.models.Transformer` on stock Flax layers (`fused=False`);
- jaxnorm: the same network on jaxnorm layers, automatic dispatch (`impl=None`);
- flashified: jaxnorm with the norm gains folded into the projections;
- norm-free: stock with every norm replaced by the identity, the floor that
  "free normalization" aims at (not a model anyone would run);
- with `--bounded-limit`, also norm-free (scaled): each norm a multiplication by one
  constant calibrated on a batch of stock (`with_scaled_norms`). Without norms some
  presets' activations grow without bound and their GEMMs multiply mostly zeros, which is
  faster work than stock's, not less of it; this limit keeps stock's scale;
- in decode cells, also stock with jaxnorm's KV-cache layout (`LAYOUT_CONTROL`): jaxnorm's
  models keep the cache as [B, KV, S, D], the layout XLA's attention dots read, where
  stock Flax keeps [B, S, KV, D] (`ModelConfig.kv_layout`); this control shows how much of
  a decode difference is that layout rather than the norms.

Each cell reports CUPTI kernel time, wall time, kernels launched, time by
kernel class, and the share of the norm-free gap jaxnorm closes,
(stock - jaxnorm) / (stock - norm-free). `--quick` runs tiny shapes on any
backend (CI exercises the code paths; its timings mean nothing).
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from rich.console import Console

from bench import timing
from jaxnorm import models

VARIANTS = ("stock", "jaxnorm", "flashified", "norm-free")
BOUNDED = "norm-free (scaled)"
LAYOUT_CONTROL = "stock, cache BKSD"
PHASES = ("prefill", "train", "decode")
DECODE_CACHE = 4096
# Decode steps per timed call (one lax.scan, as greedy_decode runs them). The cache is an
# argument of the call, not donated, so XLA copies it once a call into the scan's buffer:
# a cost a generation loop pays once, which more steps a call spread thinner.
DECODE_STEPS = 8
# How by_class_us and top_kernels are computed (JSON written before this field existed
# summed the first 1/copies of the kernel list, which is not one call: XLA interleaves
# the rotated copies' kernels).
BREAKDOWN = "every copy's kernels, each divided by the copy count"


@dataclass(frozen=True)
class ModelShape:
    """A public model's dimensions with few layers, and the batch shapes each phase runs."""

    name: str
    cfg: models.ModelConfig
    prefill: tuple[int, int]  # (batch, tokens)
    train: tuple[int, int]
    decode_batches: tuple[int, ...] = (1, 8, 64)
    cache: int = DECODE_CACHE
    decode_steps: int = DECODE_STEPS  # per timed call


def _cfg(**kw: Any) -> models.ModelConfig:
    return models.ModelConfig(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, **kw)


SHAPES: dict[str, ModelShape] = {s.name: s for s in (
    ModelShape("llama3-8b", _cfg(vocab_size=32768, d_model=4096, n_layers=2, n_heads=32,
                                 n_kv_heads=8, head_dim=128, d_ff=14336, rope_theta=5e5),
               prefill=(4, 2048), train=(2, 2048)),
    ModelShape("llama3.2-1b", _cfg(vocab_size=128256, d_model=2048, n_layers=4, n_heads=32,
                                   n_kv_heads=8, head_dim=64, d_ff=8192, rope_theta=5e5,
                                   tied_embeddings=True),
               prefill=(8, 1024), train=(4, 1024)),
    ModelShape("qwen3-0.6b", _cfg(vocab_size=151936, d_model=1024, n_layers=8, n_heads=16,
                                  n_kv_heads=8, head_dim=128, d_ff=3072, rope_theta=1e6,
                                  qk_norm=True, tied_embeddings=True),
               prefill=(8, 1024), train=(4, 1024)),
    ModelShape("qwen3-4b", _cfg(vocab_size=151936, d_model=2560, n_layers=4, n_heads=32,
                                n_kv_heads=8, head_dim=128, d_ff=9728, rope_theta=1e6,
                                qk_norm=True, tied_embeddings=True),
               prefill=(4, 2048), train=(2, 2048)),
    # Six layers: five sliding (window 512, rope base 1e4) and one full, as Gemma 3 repeats.
    ModelShape("gemma3-1b", models.gemma3(
        dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, vocab_size=262144, d_model=1152,
        n_layers=6, n_heads=4, n_kv_heads=1, head_dim=256, d_ff=6912,
        query_pre_attn_scalar=256.0),
               prefill=(4, 1024), train=(2, 1024)),
)}

QUICK = ModelShape("tiny", _cfg(vocab_size=256, d_model=128, n_layers=2, n_heads=4,
                                n_kv_heads=2, head_dim=32, d_ff=256, qk_norm=True),
                   prefill=(2, 16), train=(2, 16), decode_batches=(1, 2), cache=32)


# ------------------------------------------------------------------ variants


class Identity(nnx.Module):
    """What a norm becomes in the norm-free limit."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return x


def _without_norms(model: nnx.Module) -> nnx.Module:
    """`model` (stock layers) with every RMSNorm module replaced by the identity, in place."""
    for _, module in list(nnx.iter_modules(model)):
        for name, value in list(vars(module).items()):
            if isinstance(value, nnx.RMSNorm):
                setattr(module, name, Identity())
    return model


class ConstantScale(nnx.Module):
    """A norm replaced by a multiplication by one calibrated constant: no row statistic, and
    activations at the scale the norm held them at. XLA folds the scalar into a neighbouring
    fusion or GEMM where it can, not everywhere (the scaled limit launches more kernels than
    the identity's), so it bounds the data-bounded limit from above."""

    def __init__(self, scale: float):
        self.scale = scale

    def __call__(self, x: jax.Array) -> jax.Array:
        return x * jnp.asarray(self.scale, x.dtype)


def _input_mean_squares(model: nnx.Module, tokens: jax.Array) -> dict[int, float]:
    """id(norm) -> mean of x^2 over the input each RMSNorm module saw in one eager forward in
    which every norm already scales by its constant, so that each one is calibrated on the
    data the scaled model gives it."""
    seen: dict[int, float] = {}

    def recording(self, x, *args, **kwargs):
        seen[id(self)] = float(jnp.mean(jnp.square(x.astype(jnp.float32))))
        return ConstantScale(_scale(seen[id(self)]))(x)

    # Subclasses (Gemma's offset gain) define their own __call__: patch every class present.
    classes = {type(v) for _, m in nnx.iter_modules(model) for v in vars(m).values()
               if isinstance(v, nnx.RMSNorm)}
    originals = {cls: cls.__dict__.get("__call__") for cls in classes}
    for cls in classes:
        cls.__call__ = recording
    try:
        model(tokens)
    finally:
        for cls, original in originals.items():
            if original is None:
                del cls.__call__
            else:
                cls.__call__ = original
    return seen


def with_scaled_norms(model: nnx.Module, tokens: jax.Array) -> nnx.Module:
    """`model` (stock layers) with every RMSNorm replaced, in place, by a ConstantScale of
    1 / RMS of the input it saw on `tokens`: the norm-free limit with its data bounded.
    Without norms the residual stream of some presets grows without bound (Gemma-3-1B's to an
    RMS of ~1e14), the softmax saturates and the loss's cotangent is almost all zeros, which
    tensor cores multiply faster (bench/gpu/head_data_probe.py)."""
    mean_squares = _input_mean_squares(model, tokens)
    for _, module in list(nnx.iter_modules(model)):
        for name, value in list(vars(module).items()):
            if isinstance(value, nnx.RMSNorm):
                setattr(module, name, ConstantScale(_scale(mean_squares[id(value)])))
    return model


def _scale(mean_square: float) -> float:
    return float(1.0 / np.sqrt(mean_square + 1e-6))


def bounded_limit(stock: nnx.Module, shape: ModelShape) -> nnx.Module:
    """The norm-free limit with its norms scaled (`with_scaled_norms`), calibrated on one
    batch of the training shape's random tokens."""
    batch, length = shape.train
    tokens = _tokens(jax.random.key(0), batch, length, shape.cfg.vocab_size)
    return with_scaled_norms(models.load_params(stock, fused=False), tokens)


def build_variants(shape: ModelShape, seed: int = 0, bounded: bool = False,
                   layout_control: bool = False) -> dict[str, nnx.Module]:
    """The four variants (with `bounded` BOUNDED, with `layout_control` LAYOUT_CONTROL), all
    holding the parameters of one stock model."""
    stock = models.Transformer(shape.cfg.replace(fused=False), rngs=nnx.Rngs(seed))
    fused = models.load_params(stock, fused=True, impl=None)
    variants = {
        "stock": stock,
        "jaxnorm": fused,
        "flashified": models.flashify_model(fused),
        "norm-free": _without_norms(models.load_params(stock, fused=False)),
    }
    if bounded:
        variants[BOUNDED] = bounded_limit(stock, shape)
    if layout_control:
        variants[LAYOUT_CONTROL] = models.load_params(stock, fused=False, cache_layout="bksd")
    return variants


# ------------------------------------------------------------------ phases


def _tokens(key: jax.Array, batch: int, length: int, vocab: int) -> jax.Array:
    return jax.random.randint(key, (batch, length), 0, vocab, jnp.int32)


def prefill_case(model: nnx.Module, shape: ModelShape, copies: int):
    """(fn, arg_sets): logits of a prompt batch, no cache (prefill's forward)."""
    graphdef, state = nnx.split(model)
    batch, length = shape.prefill

    def fn(state, tokens):
        logits, _ = nnx.merge(graphdef, state)(tokens)
        return logits

    arg_sets = [(_copy(state), _tokens(jax.random.key(i), batch, length, shape.cfg.vocab_size))
                for i in range(copies)]
    return fn, arg_sets


def train_step(graphdef: nnx.GraphDef, optimizer: Any) -> Callable:
    """(state, opt_state, tokens [B, T + 1]) -> (loss, state, opt_state): next-token loss,
    gradients and one `optimizer` update of every parameter."""
    import optax

    def loss_fn(state, tokens):
        logits, _ = nnx.merge(graphdef, state)(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(
            logits.astype(jnp.float32), tokens[:, 1:]).mean()

    def fn(state, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(state, tokens)
        updates, opt_state = optimizer.update(grads, opt_state, state)
        return loss, optax.apply_updates(state, updates), opt_state

    return fn


def train_case(model: nnx.Module, shape: ModelShape, copies: int):
    """(fn, arg_sets): loss, gradients and an AdamW update of every parameter."""
    import optax

    graphdef, state = nnx.split(model)
    optimizer = optax.adamw(1e-4)
    batch, length = shape.train
    fn = train_step(graphdef, optimizer)
    arg_sets = []
    for i in range(copies):
        s = _copy(state)
        arg_sets.append((s, optimizer.init(s),
                         _tokens(jax.random.key(i), batch, length + 1, shape.cfg.vocab_size)))
    return fn, arg_sets


def decode_steps(graphdef: nnx.GraphDef, shape: ModelShape) -> Callable:
    """fn(state, token [B], cache): `shape.decode_steps` greedy steps over a full cache, one
    lax.scan, as `jaxnorm.models.greedy_decode` runs them; returns (tokens, cache)."""
    start = shape.cache - shape.decode_steps

    def fn(state, token, cache):
        model = nnx.merge(graphdef, state)

        def step(carry, _):
            token, cache, position = carry
            logits, cache = model(token[:, None], start=position, cache=cache)
            nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
            return (nxt, cache, position + 1), nxt

        (_, cache, _), tokens = jax.lax.scan(
            step, (token, cache, jnp.int32(start)), length=shape.decode_steps)
        return tokens, cache

    return fn


def decode_case(model: nnx.Module, shape: ModelShape, batch: int, copies: int):
    """(fn, arg_sets): `decode_steps` of the model over random caches and tokens."""
    graphdef, state = nnx.split(model)
    cfg = shape.cfg
    fn = decode_steps(graphdef, shape)
    kv_shape = model.cfg.cache_shape(batch, shape.cache)
    arg_sets = []
    for i in range(copies):
        keys = jax.random.split(jax.random.key(100 + i), 2 * cfg.n_layers + 1)
        cache = tuple((jax.random.normal(keys[2 * j], kv_shape, cfg.dtype),
                       jax.random.normal(keys[2 * j + 1], kv_shape, cfg.dtype))
                      for j in range(cfg.n_layers))
        token = _tokens(keys[-1], batch, 1, cfg.vocab_size)[:, 0]
        arg_sets.append((_copy(state), token, cache))
    return fn, arg_sets


def _copy(tree: Any) -> Any:
    return jax.tree.map(lambda a: jnp.array(a, copy=True), tree)


# ------------------------------------------------------------------ kernels

KERNEL_CLASSES = (
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|sm90_|sm80_|wgmma|dot", re.I)),
    ("mosaic", re.compile(r"mosaic|lazy|post_norm|row_norm|plain_matmul|pallas", re.I)),
    ("attention", re.compile(r"softmax|attention|fmha|flash", re.I)),
    ("copy", re.compile(r"copy|memcpy|memset|transpose|dynamic_update_slice|concatenate", re.I)),
    ("norm/reduction", re.compile(r"reduce|reduction|norm", re.I)),
    ("elementwise", re.compile(r"fusion|loop|convert|add|mul|select|broadcast", re.I)),
)


def kernel_class(name: str) -> str:
    for label, pattern in KERNEL_CLASSES:
        if pattern.search(name):
            return label
    return "other"


def breakdown(kernels: list[tuple[str, float]]) -> dict[str, float]:
    """Microseconds per kernel class over one call's kernels."""
    out: dict[str, float] = {}
    for name, us in kernels:
        label = kernel_class(name)
        out[label] = out.get(label, 0.0) + us
    return out


def _by_name(kernels: list[tuple[str, float]]) -> dict[str, tuple[int, float]]:
    """Per kernel name: (launches, time summed over them)."""
    totals: dict[str, tuple[int, float]] = {}
    for name, us in kernels:
        count, total = totals.get(name, (0, 0.0))
        totals[name] = (count + 1, total + us)
    return totals


def _top(kernels: list[tuple[str, float]], n: int) -> list[tuple[str, float]]:
    """The n kernel names with the most time per step, each name's launches summed."""
    totals = {name: us for name, (_, us) in _by_name(kernels).items()}
    return sorted(totals.items(), key=lambda kv: -kv[1])[:n]


# ------------------------------------------------------------------ the suite


@dataclass
class Cell:
    """One (model, phase) and its variants' measurements, per round."""

    model: str
    phase: str
    shape: str
    per_step: int  # the timed call runs this many steps (decode); times are divided by it
    rounds: list[dict[str, dict[str, Any]]] = dataclasses.field(default_factory=list)


def _measure(fn: Callable, arg_sets: list, repeats: int, warmup: int, per_step: int,
             detail: Path | None = None, console: Console | None = None,
             wall: timing.Wall | None = None) -> dict:
    start = time.perf_counter()
    t = timing.measure(fn, arg_sets, repeats=repeats, warmup=warmup, wall=wall)
    if console is not None:  # a long first call is compiling, not a stalled GPU
        total = time.perf_counter() - start
        console.print(f"    first call {t.first_call_s:.1f} s, all {total:.1f} s")
    kernels = [(name, us / per_step) for name, us in t.kernels]
    if detail is not None:
        write_detail(detail, fn, arg_sets, kernels, len(t.kernels) // max(1, t.copies))
    return {
        "wall_us": t.wall_us / per_step,
        "wall_samples_us": [round(w / per_step, 1) for w in t.wall_samples_us],
        "kernel_us": None if t.kernel_us is None else t.kernel_us / per_step,
        "kernels": len(t.kernels) / t.copies / per_step,
        # (samples, min, max): how far one variant's own samples spread within the round
        "wall_spread_us": _spread(t.wall_samples_us, per_step),
        "kernel_spread_us": _spread(t.kernel_samples_us, per_step),
        "by_class_us": breakdown(kernels),
        "top_kernels": _top(kernels, 16),
        "cupti_error": t.cupti_error,
    }


def _spread(samples: list[float], per_step: int) -> list[float]:
    """[count, min, max] per step of one variant's samples; [0] where there are none."""
    if not samples:
        return [0]
    return [len(samples), round(min(samples) / per_step, 1), round(max(samples) / per_step, 1)]


def write_detail(path: Path, fn: Callable, arg_sets: list, kernels: list[tuple[str, float]],
                  per_call: int) -> None:
    """Every kernel name's launches and time per step, and the optimized HLO of the timed
    program (its fusion names are the kernel names), so a cell's gap can be traced to the
    fusions behind it (`--detail`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = sorted(([name, count, us] for name, (count, us) in _by_name(kernels).items()),
                  key=lambda r: -r[2])
    path.parent.joinpath(path.name + ".kernels.json").write_text(json.dumps(
        {"launches_per_call": per_call, "kernels": rows}, indent=0))
    path.parent.joinpath(path.name + ".hlo.txt").write_text(timing.measured_hlo(fn, arg_sets))


def _cases(shape: ModelShape, copies: int, phases: tuple[str, ...]):
    """(phase label, shape text, per-step count, case(model) -> (fn, arg_sets)) per cell."""
    if "prefill" in phases:
        yield ("prefill", "x".join(map(str, shape.prefill)), 1,
               lambda m: prefill_case(m, shape, copies))
    if "train" in phases:
        yield ("train", "x".join(map(str, shape.train)), 1,
               lambda m: train_case(m, shape, copies))
    steps = "" if shape.decode_steps == DECODE_STEPS else f", {shape.decode_steps} steps a call"
    for batch in shape.decode_batches if "decode" in phases else ():
        yield (f"decode B={batch}", f"B={batch}, cache {shape.cache}{steps}", shape.decode_steps,
               lambda m, batch=batch: decode_case(m, shape, batch, copies))


def measurement_order(variants: list[str], round_index: int) -> list[str]:
    """The variants in the order round `round_index` measures them: rotated by one per
    round, so no variant is always measured first (or always right after the same one)
    and a drift across a round (clocks, allocator state) does not fall on one variant."""
    shift = round_index % len(variants)
    return variants[shift:] + variants[:shift]


def run(shapes: list[ModelShape], *, rounds: int = 2, repeats: int = 20, warmup: int = 3,
        copies: int = 1, phases: tuple[str, ...] = PHASES, out: Path | None = None,
        detail: Path | None = None, bounded: bool = False, layout_control: bool = True,
        variants: Sequence[str] | None = None, console: Console | None = None) -> list[Cell]:
    """Measure every cell: `rounds` rounds, each taking the variants' wall samples in turn
    (one of each per pass, in the order `measurement_order` gives the round), then each
    variant's CUPTI kernel time in that order.

    One copy of the inputs by default: a model's weights and cache exceed the L2 cache
    alone, and one copy is timed as one program (bench/timing.py), so each variant
    compiles once per cell; compiling dominated a cell's time with two copies. Every
    variant's inputs are alive through a round (their wall samples alternate).

    With `out`, the results so far are rewritten after every cell, so a run cut
    short keeps what it measured. A cell whose variants run out of device memory is
    recorded as not measured (`to_json`'s "skipped") and the run goes on. With `detail`, round 1 also writes each variant's
    kernels by name and its optimized HLO there. With `bounded`, the scaled limit is a
    fifth variant (`BOUNDED`); with `layout_control`, decode cells also measure
    `LAYOUT_CONTROL`. With `variants`, only those are measured (stock and jaxnorm always
    among them), so that a cell whose five caches do not fit the device can run with fewer.
    """
    selected = selected_variants(variants, bounded=bounded, layout_control=layout_control)
    console = console or Console(stderr=True)
    cells: list[Cell] = []
    skipped: list[dict[str, str]] = []
    for shape in shapes:
        built = build_variants(shape, bounded=bounded, layout_control=layout_control)
        for phase, text, per_step, case in _cases(shape, copies, phases):
            resident = {v: m for v, m in built.items() if v in selected
                        and (v != LAYOUT_CONTROL or phase.startswith("decode"))}
            try:
                cell = _measure_cell(Cell(shape.name, phase, text, per_step), resident, case,
                                     rounds=rounds, repeats=repeats, warmup=warmup,
                                     detail=detail, console=console)
            except jax.errors.JaxRuntimeError as e:
                if "RESOURCE_EXHAUSTED" not in str(e):
                    raise
                reason = str(e).splitlines()[0][:300]
                skipped.append({"model": shape.name, "phase": phase, "reason": reason})
                console.print(f"[{shape.name}] {phase}: not measured, out of device memory "
                              f"with {len(resident)} variants resident ({reason}); "
                              "going on with the next cell")
            else:
                cells.append(cell)
                console.print(summary_line(cell))
            if out is not None:
                write(cells, out, skipped=skipped)
    return cells


def selected_variants(names: Sequence[str] | None, *, bounded: bool,
                       layout_control: bool) -> frozenset[str]:
    """The variants `run` measures: all it builds, or `names`, which must be among them and
    hold stock and jaxnorm (every ratio is jaxnorm's over stock's)."""
    built = {*VARIANTS, *([BOUNDED] if bounded else []),
             *([LAYOUT_CONTROL] if layout_control else [])}
    if names is None:
        return frozenset(built)
    unknown = sorted(set(names) - built)
    if unknown:
        raise ValueError(f"variants {unknown} are not built by this run; choose from "
                         f"{sorted(built)} (the scaled limit needs bounded=True)")
    missing = [v for v in ("stock", "jaxnorm") if v not in names]
    if missing:
        raise ValueError(f"variants must include {missing}: every ratio is jaxnorm / stock")
    return frozenset(names)


def _measure_cell(cell: Cell, variants: dict[str, nnx.Module], case: Callable, *, rounds: int,
                  repeats: int, warmup: int, detail: Path | None, console: Console) -> Cell:
    """One cell's rounds: every variant's wall samples in turn, then each one's CUPTI time."""
    fns = {v: case(m)[0] for v, m in variants.items()}  # one function each, compiled once
    for r in range(rounds):
        order = measurement_order(list(variants), r)
        arg_sets = {v: case(variants[v])[1] for v in order}
        console.print(f"[{cell.model}] {cell.phase}: wall samples of {', '.join(order)}, "
                      "in turn")
        walls = timing.interleaved_wall({v: (fns[v], arg_sets[v]) for v in order},
                                        repeats=repeats, warmup=warmup)
        results = {}
        for variant in order:
            console.print(f"[{cell.model}] {cell.phase} round {r + 1}: {variant}")
            label = f"{cell.model}-{cell.phase.replace(' ', '').replace('=', '')}-{variant}"
            where = None if detail is None or r else detail / label
            results[variant] = _measure(fns[variant], arg_sets[variant], repeats, warmup,
                                        cell.per_step, where, console, walls[variant])
        del arg_sets
        cell.rounds.append({v: results[v] for v in variants})
    return cell


def paired_wall_quartiles(cell: Cell, r: int, variant: str) -> tuple[float, float, float] | None:
    """(lower quartile, median, upper quartile) over round r's passes of variant's wall sample
    / stock's from the same pass (taken one after the other), or None where the round kept
    no samples (older records). A ratio of 1 inside the quartiles is stock's time within
    the round's pass-to-pass noise."""
    a = cell.rounds[r][variant].get("wall_samples_us")
    b = cell.rounds[r]["stock"].get("wall_samples_us")
    return timing.paired_quartiles(a, b) if a and b else None


def paired_wall_ratio(cell: Cell, r: int, variant: str) -> float | None:
    """The median of `paired_wall_quartiles`, or None."""
    quartiles = paired_wall_quartiles(cell, r, variant)
    return None if quartiles is None else quartiles[1]


def gap_closed(stock: float, candidate: float, limit: float) -> float | None:
    """(stock - candidate) / (stock - limit): 1 is the norm-free limit, 0 is stock, < 0 worse."""
    gap = stock - limit
    return None if gap <= 0 else (stock - candidate) / gap


def _metric(cell: Cell, r: int, variant: str, metric: str) -> float:
    value = cell.rounds[r][variant][metric]
    return float("nan") if value is None else value


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def summary_line(cell: Cell) -> str:
    parts = []
    for metric in ("kernel_us", "wall_us"):
        ratios = [_ratio(_metric(cell, r, "jaxnorm", metric), _metric(cell, r, "stock", metric))
                  for r in range(len(cell.rounds))]
        parts.append(f"{metric[:-3]} jaxnorm/stock " + ", ".join(f"{x:.3f}" for x in ratios))
    paired = [paired_wall_ratio(cell, r, "jaxnorm") for r in range(len(cell.rounds))]
    if None not in paired:
        parts.append("paired wall " + ", ".join(f"{x:.3f}" for x in paired))
    return f"{cell.model} {cell.phase}: " + "; ".join(parts)


def measured_variants(cells: list[Cell]) -> tuple[str, ...]:
    """VARIANTS, then any other variant a cell measured (BOUNDED; a probe's variant kept in a
    record), in the order the cells first list them."""
    extra = [v for c in cells for v in c.rounds[0] if v not in VARIANTS]
    return VARIANTS + tuple(dict.fromkeys(extra))


def to_json(cells: list[Cell], skipped: Sequence[dict[str, str]] = ()) -> dict:
    """The cells, and (`skipped`) the cells a run could not measure, each with its reason."""
    return {"suite": "model", "cells": [dataclasses.asdict(c) for c in cells],
            **({"skipped": list(skipped)} if skipped else {}),
            "variants": measured_variants(cells),
            "decode_steps_per_call": next((c.per_step for c in cells
                                           if c.phase.startswith("decode")), DECODE_STEPS),
            "breakdown": BREAKDOWN, "jax": jax.__version__,
            "devices": [d.device_kind for d in jax.devices()]}


def from_json(payload: dict) -> list[Cell]:
    return [Cell(**cell) for cell in payload["cells"]]


def to_markdown(cells: list[Cell], *, breakdown: bool = True,
                skipped: Sequence[dict[str, str]] = ()) -> str:
    """Per cell and metric: each variant's median over rounds, the per-round ratios, the gap
    (and the gap to the scaled limit where it was measured); the cells not measured, with
    why; then, with `breakdown`, time by kernel class."""
    variants = measured_variants(cells)
    limits = [v for v in ("norm-free", BOUNDED) if v in variants]
    lines = [
        "| model | phase | shape | metric | " + " | ".join(variants)
        + " | jaxnorm/stock (rounds) | "
        + " | ".join("gap closed (rounds)" if v == "norm-free" else f"gap closed to {v} (rounds)"
                     for v in limits) + " |",
        "|---|---|---|---|" + "---:|" * len(variants) + "---|" * (1 + len(limits)),
    ]
    for cell in cells:
        n = len(cell.rounds)
        for metric, unit in (("kernel_us", "kernel us"), ("wall_us", "wall us"),
                             ("kernels", "kernels")):
            med = {v: statistics.median(_metric(cell, r, v, metric) for r in range(n))
                   if v in cell.rounds[0] else float("nan") for v in variants}
            ratios = ", ".join(
                f"{_ratio(_metric(cell, r, 'jaxnorm', metric), _metric(cell, r, 'stock', metric)):.3f}"
                for r in range(n))
            gaps = [", ".join(_gaps(cell, metric, limit)) if metric != "kernels" else ""
                    for limit in limits]
            digits = 1 if metric != "kernels" else 0
            fmt = lambda x: "-" if np.isnan(x) else f"{x:.{digits}f}"  # noqa: E731
            lines.append(
                f"| {cell.model} | {cell.phase} | {cell.shape} | {unit} | "
                + " | ".join(fmt(med[v]) for v in variants)
                + f" | {ratios} | " + " | ".join(gaps) + " |")
    paired = []
    for cell in cells:
        for v in variants[1:]:
            quartiles = [paired_wall_quartiles(cell, r, v) if v in cell.rounds[r] else None
                         for r in range(len(cell.rounds))]
            if quartiles and None not in quartiles:
                paired.append(f"| {cell.model} | {cell.phase} | {v} | " + ", ".join(
                    f"{m:.3f} [{lo:.3f}-{hi:.3f}]" for lo, m, hi in quartiles) + " |")
    if paired:
        lines += ["", "Wall time paired by pass (a variant's sample over stock's from the same "
                  "pass), per round: median [quartiles]", "",
                  "| model | phase | variant | vs stock (rounds) |", "|---|---|---|---|", *paired]
    if skipped:
        lines += ["", "Not measured: " + "; ".join(
            f"{c['model']} {c['phase']} ({c['reason']})" for c in skipped)]
    if not breakdown:
        return "\n".join(lines) + "\n"
    lines += ["", "Time by kernel class, round 1 (us per step):", "",
              "| model | phase | variant | " + " | ".join(c for c, _ in KERNEL_CLASSES)
              + " | other |", "|---|---|---|" + "---:|" * (len(KERNEL_CLASSES) + 1)]
    for cell in cells:
        for v in cell.rounds[0]:
            by = cell.rounds[0][v]["by_class_us"]
            lines.append(f"| {cell.model} | {cell.phase} | {v} | " + " | ".join(
                f"{by.get(c, 0.0):.1f}" for c, _ in (*KERNEL_CLASSES, ("other", None))) + " |")
    return "\n".join(lines) + "\n"


def _gaps(cell: Cell, metric: str, limit: str) -> list[str]:
    """The share of the gap to `limit` closed in each round ("n/a" where the limit was
    not faster than stock or not measured)."""
    out = []
    for r in range(len(cell.rounds)):
        if limit not in cell.rounds[r]:
            out.append("n/a")
            continue
        g = gap_closed(*(_metric(cell, r, v, metric) for v in ("stock", "jaxnorm", limit)))
        out.append("n/a" if g is None or np.isnan(g) else f"{100 * g:.0f}%")
    return out


def plot(cells: list[Cell], path: Path) -> None:
    """Each variant's kernel time relative to stock per cell (bars), 1.0 = stock."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{c.model}\n{c.phase}" for c in cells]
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(cells)), 4.5))
    variants = measured_variants(cells)
    width = 0.8 / (len(variants) - 1)
    for i, v in enumerate(variants[1:]):
        ys = [statistics.median(_ratio(_metric(c, r, v, "kernel_us"),
                                       _metric(c, r, "stock", "kernel_us"))
                                for r in range(len(c.rounds))) if v in c.rounds[0]
              else float("nan") for c in cells]
        ax.bar(np.arange(len(cells)) + (i - 1) * width, ys, width, label=v)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(cells)), labels, fontsize=7, rotation=45, ha="right")
    ax.set_ylabel("CUPTI kernel time / stock Flax's")
    ax.set_ylim(0.7, 1.2)
    ax.set_title("Model suite: below the line is faster than stock; norm-free is the floor")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(cells: list[Cell], out: Path, *, skipped: Sequence[dict[str, str]] = ()) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "model-suite.json", out / "model-suite.md", out / "model-suite.png"]
    paths[0].write_text(json.dumps(to_json(cells, skipped), indent=1))
    paths[1].write_text(to_markdown(cells, skipped=skipped))
    plot(cells, paths[2])
    return paths
