"""A model-suite cell (training step or prefill) with more variants than the suite's four,
measured in rounds (order rotated; wall samples taken in turn, one of each variant per
pass, then CUPTI per variant), to take jaxnorm's model apart:

- "unfused attention input": jaxnorm's model with `jaxnorm.rms_norm_attention_input`
  off, so q/k/v come from the pre-norm projections and the heads are normed by
  `jaxnorm.nnx.RMSNorm` and rotated by the model's rope, in [B, T, H, hd];
- "stock QK-norm": that, with the q/k norm modules stock Flax's nnx.RMSNorm (same gains);
- "kernels declined": jaxnorm's model with automatic dispatch answering xla for every op
  (as on a GPU without Mosaic kernels): its graph without any kernel forward;
- "norm backward kernel": jaxnorm's model with RMSNorm's backward kernel taken wherever it
  serves the rows (pallas_kernels/rms_norm_backward.py), as if its measured table
  (jaxnorm/backends/norm_backward_measured.py) had it faster at every training shape;
- "residual GEMM": jaxnorm's model with the residual GEMM (`jaxnorm.residual_dense`:
  o- and down-projection plus the residual, the sum's row statistics in its epilogue)
  taken wherever it serves the rows, as if it had measured faster than XLA everywhere;
- "post-norm kernel": jaxnorm's model with the post-norm GEMM (`jaxnorm.dense_rms_norm`,
  Gemma's r + Norm(x @ W) with the residual after) taken wherever it serves the rows, as
  if it had measured faster than XLA's dot, norm and add everywhere;
- "gain in the mainloop": jaxnorm's model with the lazy pre-norm GEMM scaling each x tile
  by the norm's gain in its mainloop (`lazy_rms_matmul(gain_in_kernel=True)`) instead of
  an XLA pass scaling x or the weights before it, wherever its config allows;
- "statistics kernel in training": jaxnorm's model with the pre-norm kernel that takes
  the producer's statistics running in a training step's forward too, paired with the VJP
  of stock's graph (`dispatch.call_with_stock_backward` runs stock's forward there);
- "attention input declined", "gated declined", "pre-norm GEMM declined": jaxnorm's model
  with automatic dispatch answering xla for that one op (`rms_norm_attention_input`,
  `rms_norm_gated_dense`, `rms_norm_dense`) and choosing as usual for the rest, to tell
  which kernel a cost comes with;
- "gated kernel": jaxnorm's model with the gated MLP-input kernel taken wherever it
  serves the rows, whatever its activation (dispatch declines GeGLU at prefill);
- "norm-free (scaled)": the norm-free limit with each norm a multiplication by a constant
  calibrated on one batch of stock (`model_suite.with_scaled_norms`): the limit's work,
  with activations at stock's scale instead of growing without bound.

With --detail, round 1 writes each variant's kernels by name and optimized HLO, for
`python -m bench.kernel_diff DIR A B --model M`. Usage:
python bench/gpu/variant_probe.py --model gemma3-1b --phase train \
    --variants stock,jaxnorm,"kernels declined",norm-free --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
from flax import nnx

from bench import model_suite, timing
from jaxnorm import dispatch, models
from jaxnorm.models import layers
from pallas_kernels import lazy_norm_matmul
from pallas_kernels.errors import Unsupported

EXTRA = ("unfused attention input", "stock QK-norm", "kernels declined", "norm backward kernel",
         "residual GEMM", "post-norm kernel", "gain in the mainloop", "statistics kernel in training",
         "attention input declined", "gated declined", "pre-norm GEMM declined",
         "gated kernel", model_suite.BOUNDED)
# The ops the "... declined" variants keep on the xla path.
DECLINED_OPS = {"attention input declined": "rms_norm_attention_input",
                "gated declined": "rms_norm_gated_dense",
                "pre-norm GEMM declined": "rms_norm_dense"}


@contextlib.contextmanager
def _patched(module: object, name: str, value: object) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


def traced_with(fn: Callable, context: Callable[[], contextlib.AbstractContextManager]
                ) -> Callable:
    """fn, traced (so compiled) inside `context`."""
    def inside(*args):
        with context():
            return fn(*args)
    return inside


@contextlib.contextmanager
def _kernel_everywhere(op: str) -> Iterator[None]:
    """Automatic dispatch taking `op`'s kernel at every shape it serves (its decline rule
    lifted)."""
    dispatch._load_mosaic_backends()
    rule = dispatch._DECLINE_AUTO.pop(op)
    try:
        yield
    finally:
        dispatch._DECLINE_AUTO[op] = rule


@contextlib.contextmanager
def _declined(op: str) -> Iterator[None]:
    """Automatic dispatch answering xla for `op` at every shape (a decline rule that always
    objects), the other ops choosing as usual."""
    dispatch._load_mosaic_backends()
    rule = dispatch._DECLINE_AUTO.get(op)
    dispatch._DECLINE_AUTO[op] = lambda *a, **k: "declined by bench/gpu/variant_probe.py"
    try:
        yield
    finally:
        if rule is None:
            del dispatch._DECLINE_AUTO[op]
        else:
            dispatch._DECLINE_AUTO[op] = rule


def _gain_in_mainloop() -> contextlib.AbstractContextManager:
    """The lazy pre-norm GEMM taking its gain in the mainloop wherever its config serves it
    (`gemm_config.check_epilogue` declines a 2-CTA cluster or a wgmma step in flight)."""
    original = lazy_norm_matmul.lazy_rms_matmul

    def with_gain(x, weights, *, scale=None, **kw):
        if scale is not None:
            try:
                return original(x, weights, scale=scale, gain_in_kernel=True, **kw)
            except Unsupported:  # the XLA pass scales x or the weights instead
                pass
        return original(x, weights, scale=scale, **kw)

    return _patched(lazy_norm_matmul, "lazy_rms_matmul", with_gain)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4, 5))
def _statistics_kernel_forward(op: str, impl: str, kwargs: tuple, return_input: bool,
                               automatic: bool, lead: tuple[int, ...] | None, args: tuple):
    """The given-statistics kernel whatever differentiates it; the VJP of stock's graph."""
    return dispatch._call_returning_input(op, impl, kwargs, return_input, args)


def _statistics_kernel_forward_fwd(op, impl, kwargs, return_input, automatic, lead, args):
    return (_statistics_kernel_forward(op, impl, kwargs, return_input, automatic, lead, args),
            args)


def _statistics_kernel_forward_bwd(op, impl, kwargs, return_input, automatic, lead, args,
                                   cotangents):
    _, vjp = dispatch._xla_vjp(op, kwargs, return_input, automatic, args[:-1], lead)
    (grads,) = vjp(cotangents)
    return ((*grads, None),)


_statistics_kernel_forward.defvjp(_statistics_kernel_forward_fwd,
                                  _statistics_kernel_forward_bwd)


def _statistics_kernel_in_training() -> contextlib.AbstractContextManager:
    """`dispatch.call_with_stock_backward` with the kernel's forward under differentiation."""
    def call(op, impl, *args, return_input=False, lead=None, **kwargs):
        return _statistics_kernel_forward(op, impl, tuple(sorted(kwargs.items())),
                                          return_input, dispatch._AUTOMATIC.get(), lead, args)
    return _patched(dispatch, "call_with_stock_backward", call)


def with_stock_qk_norms(stock: nnx.Module) -> nnx.Module:
    """jaxnorm's model of `stock`'s parameters, its blocks' q_norm and k_norm stock's."""
    out = models.load_params(stock, fused=True, impl=None)
    donor = models.load_params(stock, fused=False)
    for block, stock_block in zip(out.layers, donor.layers):
        block.attn.q_norm, block.attn.k_norm = stock_block.attn.q_norm, stock_block.attn.k_norm
    return out


def probe_variants(shape: model_suite.ModelShape, case: Callable,
                   labels: list[str]) -> dict[str, tuple[nnx.Module, Callable]]:
    """label -> (model, the function timed)."""
    models_ = model_suite.build_variants(shape)
    unfused = lambda: _patched(layers, "fuses_attention_input", lambda cfg: False)
    declined = lambda: _patched(dispatch, "hopper_or_newer", lambda: False)
    contexts = {"unfused attention input": unfused, "kernels declined": declined,
                "norm backward kernel": lambda: _kernel_everywhere("rms_norm_backward"),
                "residual GEMM": lambda: _kernel_everywhere("residual_dense"),
                "post-norm kernel": lambda: _kernel_everywhere("dense_rms_norm"),
                "gated kernel": lambda: _kernel_everywhere("rms_norm_gated_dense"),
                "gain in the mainloop": _gain_in_mainloop,
                "statistics kernel in training": _statistics_kernel_in_training,
                **{label: functools.partial(_declined, op) for label, op in DECLINED_OPS.items()}}
    out = {}
    for label in labels:
        if label == model_suite.BOUNDED:
            model = model_suite.bounded_limit(models_["stock"], shape)
            out[label] = model, case(model)[0]
        elif label == "stock QK-norm":
            model = with_stock_qk_norms(models_["stock"])
            out[label] = model, traced_with(case(model)[0], unfused)
        elif label in EXTRA:
            model = models_["jaxnorm"]
            out[label] = model, traced_with(case(model)[0], contexts[label])
        else:
            out[label] = models_[label], case(models_[label])[0]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-0.6b", choices=(*model_suite.SHAPES, "tiny"))
    parser.add_argument("--phase", default="train", choices=("train", "prefill"))
    parser.add_argument("--variants", default=",".join(
        ("stock", "jaxnorm", *EXTRA[:2], "flashified", "norm-free")))
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--detail", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    labels = args.variants.split(",")
    unknown = set(labels) - set(model_suite.VARIANTS) - set(EXTRA)
    if unknown or "stock" not in labels:
        parser.error(f"--variants: stock and any of {model_suite.VARIANTS + EXTRA}; "
                     f"unknown {sorted(unknown)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = model_suite.QUICK if args.model == "tiny" else model_suite.SHAPES[args.model]
    case = lambda m: (model_suite.train_case if args.phase == "train"
                      else model_suite.prefill_case)(m, shape, 1)
    variants = probe_variants(shape, case, labels)
    detail = out / f"{shape.name}-{args.phase}" if args.detail else None
    rows = measure_rounds(variants, case, labels, rounds=args.rounds, repeats=args.repeats,
                          detail=detail)
    summary = summarize_rows(rows, labels, args.rounds)
    for label in labels:
        print(label, summary[label], flush=True)
    (out / f"probe-{shape.name}-{args.phase}.json").write_text(json.dumps(
        {"model": shape.name, "phase": args.phase, "shape": getattr(shape, args.phase),
         "rows": rows, "summary": summary}, indent=1))


def measure_rounds(variants: dict[str, tuple[nnx.Module, Callable]], case: Callable,
                   labels: list[str], *, rounds: int, repeats: int,
                   detail: Path | None = None) -> list[dict]:
    """A row per round and variant (label -> (model, the function timed); `case(model)[1]`
    its inputs): order rotated each round, every variant's wall samples taken in turn, then
    CUPTI per variant. `detail`: round 1 writes each variant's kernels and HLO at
    "<detail>-<label>"."""
    rows = []
    for r in range(rounds):
        order = model_suite.measurement_order(labels, r)
        arg_sets = {label: case(variants[label][0])[1] for label in order}
        walls = timing.interleaved_wall({label: (variants[label][1], arg_sets[label])
                                         for label in order}, repeats=repeats)
        for label in order:
            fn = variants[label][1]
            t = timing.measure(fn, arg_sets[label], repeats=repeats, wall=walls[label])
            row = {"round": r + 1, "variant": label, "wall_us": round(t.wall_us),
                   "wall_samples_us": [round(w) for w in t.wall_samples_us],
                   "kernel_us": t.kernel_us and round(t.kernel_us),
                   "kernel_samples_us": [round(k) for k in t.kernel_samples_us],
                   "best_us": round(t.best_us), "kernels": len(t.kernels),
                   "first_call_s": round(t.first_call_s, 1)}
            if r == 0 and detail is not None:
                name = f"{detail.name}-{label.replace(' ', '_')}"
                model_suite.write_detail(detail.parent / name, fn, arg_sets[label],
                                         list(t.kernels), len(t.kernels))
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if not k.endswith("samples_us")}),
                  flush=True)
        del arg_sets
    return rows


def summarize_rows(rows: list[dict], labels: list[str], rounds: int) -> dict[str, dict]:
    """Per variant against stock, by round: kernel time (CUPTI; wall where it is missing),
    and the wall time paired by pass (the median of its sample over stock's from the same
    pass of `timing.interleaved_wall`)."""
    by = {(x["round"], x["variant"]): x for x in rows}
    summary = {}
    for label in labels:
        ratios = [by[r, label]["best_us"] / by[r, "stock"]["best_us"]
                  for r in range(1, rounds + 1)]
        paired = [timing.paired_quartiles(by[r, label]["wall_samples_us"],
                                          by[r, "stock"]["wall_samples_us"])[1]
                  for r in range(1, rounds + 1)]
        summary[label] = {"vs_stock": [round(x, 4) for x in ratios],
                          "median": round(statistics.median(ratios), 4),
                          "wall_paired_vs_stock": [round(x, 4) for x in paired]}
    return summary


if __name__ == "__main__":
    main()
