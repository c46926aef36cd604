"""`python -m jaxnorm.doctor`: can this machine run jaxnorm's kernels, and which ops would?

Prints the jax/jaxlib/flax versions, the devices (GPU name, compute capability,
SM count), whether the Mosaic GPU kernels can run here (on a Hopper GPU: one
small call of each op with impl="mosaic", judged against verify's float64
reference), and, for a few model-sized shapes and any given with --shape, the
implementation automatic dispatch (impl=None) picks for each op and why.

The picks are dispatch's own: each op is traced with `jax.eval_shape` (nothing
is computed) and `dispatch.last_automatic_choice` reports what it decided.

    python -m jaxnorm.doctor [--shape MxKxN[+N...]] [--dtype bfloat16] [--no-residual]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

import jaxnorm
from jaxnorm import dispatch

OPS = ("rms_norm", "layer_norm", "rms_norm_dense", "layer_norm_dense",
       "dense_rms_norm", "dense_layer_norm")
_PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax")


@dataclass(frozen=True)
class Shape:
    """Rows M of width K; pre-norm ops project to each N, post-norm ops take one N."""

    m: int
    k: int
    ns: tuple[int, ...]
    what: str = ""

    def __str__(self) -> str:
        return f"{self.m}x{self.k}x{'+'.join(map(str, self.ns))}"


# Llama-3-8B (hidden 4096, 8 KV heads of 128, MLP 14336) and Gemma-2-2B (hidden
# 2304, attention output 2048, post-norms), at decode and prefill row counts.
MODEL_SHAPES = (
    Shape(16, 4096, (4096, 1024, 1024), "Llama-3-8B q/k/v, decoding 16 sequences"),
    Shape(4096, 4096, (4096, 1024, 1024), "Llama-3-8B q/k/v, prefill of 4096 tokens"),
    Shape(8192, 4096, (14336, 14336), "Llama-3-8B gate/up, 8192 tokens"),
    Shape(16, 2048, (2304,), "Gemma-2-2B attention output + post-norm, decoding 16"),
    Shape(8192, 2048, (2304,), "Gemma-2-2B attention output + post-norm, 8192 tokens"),
    Shape(8192, 4096, (4096,), "Llama-3-8B-sized output projection, 8192 tokens"),
)


def parse_shape(text: str) -> Shape:
    """'MxKxN' or 'MxKxN1+N2+...' (several projections sharing one norm)."""
    try:
        m, k, ns = text.lower().split("x")
        shape = Shape(int(m), int(k), tuple(int(n) for n in ns.split("+")), "from --shape")
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--shape must look like MxKxN or MxKxN1+N2 (e.g. 4096x4096x4096+1024+1024); "
            f"got {text!r}") from None
    if min(shape.m, shape.k, *shape.ns) < 1:
        raise argparse.ArgumentTypeError(f"--shape dimensions must be >= 1; got {text!r}")
    return shape


def _versions() -> list[str]:
    lines = []
    for package in _PACKAGES:
        try:
            lines.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            if package in ("jax", "jaxlib", "flax"):
                lines.append(f"{package} not installed")
    return lines


def _devices() -> list[str]:
    lines = []
    for d in jax.devices():
        extra = [f"compute capability {d.compute_capability}"] if hasattr(
            d, "compute_capability") else []
        extra += [f"{d.core_count} SMs"] if hasattr(d, "core_count") else []
        lines.append(f"{d.id}: {d.platform} {d.device_kind}"
                     + (f" ({', '.join(extra)})" if extra else ""))
    return lines


def _op_call(op: str, shape: Shape, residual: bool) -> Callable[..., object] | None:
    """The public op at `shape` with impl=None, as a function of its arrays; None if the op
    takes one kernel and `shape` names several."""
    post = op.startswith("dense_")
    if post and len(shape.ns) != 1:
        return None
    fn = getattr(jaxnorm, op)
    if op in ("rms_norm", "layer_norm"):
        return lambda x, scale, bias, *_: fn(x, scale) if op == "rms_norm" else fn(x, scale, bias)
    if op == "rms_norm_dense":
        return lambda x, scale, bias, kernels, *_: fn(x, scale, list(kernels))
    if op == "layer_norm_dense":
        return lambda x, scale, bias, kernels, *_: fn(x, scale, bias, list(kernels))
    res = (lambda r: r) if residual else (lambda r: None)
    if op == "dense_rms_norm":
        return lambda x, scale, bias, kernels, r: fn(x, kernels[0], None, scale, residual=res(r))
    return lambda x, scale, bias, kernels, r: fn(x, kernels[0], None, scale, bias,
                                                 residual=res(r))


def automatic_choice(op: str, shape: Shape, dtype: jnp.dtype,
                     residual: bool = True) -> tuple[str, str | None] | None:
    """(implementation, why xla or None) impl=None picks for `op` at `shape`; None when
    the op does not apply (a post-norm op with several projections)."""
    fn = _op_call(op, shape, residual)
    if fn is None:
        return None
    post = op.startswith("dense_")
    width = shape.ns[0] if post else shape.k
    spec = jax.ShapeDtypeStruct
    args = (spec((shape.m, shape.k), dtype), spec((width,), jnp.float32),
            spec((width,), jnp.float32), tuple(spec((shape.k, n), dtype) for n in shape.ns),
            spec((shape.m, shape.ns[0]), dtype))
    jax.eval_shape(fn, *args)
    return dispatch.last_automatic_choice(op)


BACKWARD = "rms_norm_backward"


def automatic_backward_choice(shape: Shape, dtype: jnp.dtype) -> tuple[str, str | None]:
    """(implementation, why xla or None) a training step picks for the backward of an
    RMSNorm of `shape`'s rows (`dispatch.decide`, recording nothing)."""
    x = jax.ShapeDtypeStruct((shape.m, shape.k), dtype)
    return dispatch.decide(BACKWARD, x, x, jax.ShapeDtypeStruct((shape.k,), jnp.float32),
                           eps=1e-6, scale_offset=0.0)


def _kernel_inputs(op: str, dtype: jnp.dtype, rng: np.random.Generator) -> dict:
    """Fresh random inputs for one small call the kernels serve (K, N multiples of 128)."""
    m, k, n = 128, 256, 256

    def draw(*dims: int, dt: jnp.dtype = dtype, std: float = 1.0) -> np.ndarray:
        return (std * rng.standard_normal(dims)).astype(np.float32).astype(dt)

    inputs = dict(x=draw(m, k), scale=draw(n if op.startswith("dense_") else k, dt=np.float32))
    if op in ("rms_norm", "layer_norm"):
        return inputs | ({"bias": draw(k, dt=np.float32)} if op == "layer_norm" else {})
    inputs |= dict(kernel=draw(k, n, std=k ** -0.5), bias=None)
    if op == "layer_norm_dense":
        inputs["norm_bias"] = draw(k, dt=np.float32)
    if op.startswith("dense_"):
        inputs["residual"] = draw(m, n)
        if op == "dense_layer_norm":
            inputs["norm_bias"] = draw(n, dt=np.float32)
    return inputs


def kernel_check(impl: str, ops: tuple[str, ...] = OPS, seed: int = 0) -> dict[str, str]:
    """Run each op once with `impl` ("mosaic" or "interpret") on a small bfloat16 call and
    judge it with verify; op -> "ok (worst err/tol ...)", "declined: ..." or "FAILED: ..."."""
    from verify import check_op  # the judge: float64 reference and error model

    rng = np.random.default_rng(seed)
    results = {}
    for op in ops:
        try:
            ratio = check_op(op, impl, **_kernel_inputs(op, jnp.bfloat16, rng))
            results[op] = f"ok (worst error/tolerance {ratio:.2g})"
        except jaxnorm.Unsupported as reason:
            results[op] = f"declined: {reason}"
        except Exception as err:  # the doctor reports any failure rather than stopping
            results[op] = f"FAILED: {type(err).__name__}: {str(err).splitlines()[0][:300]}"
    return results


def report(shapes: tuple[Shape, ...], dtype: jnp.dtype, residual: bool,
           check_impl: str | None) -> tuple[str, bool]:
    """The doctor's text and whether every kernel check passed (True when none ran)."""
    lines = ["versions:", *(f"  {v}" for v in _versions()), "devices:",
             *(f"  {d}" for d in _devices())]
    unsupported = dispatch.device_unsupported_reason()
    lines.append("Mosaic GPU kernels: " + ("can run on the default device" if unsupported is None
                                           else f"cannot run here: {unsupported}"))
    healthy = True
    if check_impl is not None:
        lines.append(f"kernel check (impl={check_impl!r}, bfloat16 128x256, N=256):")
        for op, verdict in kernel_check(check_impl).items():
            healthy &= not verdict.startswith("FAILED")
            lines.append(textwrap.fill(f"{op}: {verdict}", width=100, initial_indent="  ",
                                       subsequent_indent="    "))
    lines.append(f"automatic dispatch (impl=None), {jnp.dtype(dtype).name} activations"
                 f"{', post-norm ops with a residual' if residual else ''}:")
    for shape in shapes:
        lines.append(f"  {shape}  ({shape.what})")
        for op in OPS:
            choice = automatic_choice(op, shape, dtype, residual)
            if choice is None:
                lines.append(f"    {op:<17} n/a: takes one kernel, the shape names several")
                continue
            impl, reason = choice
            lines.append(_decision_line(op, impl, reason, unsupported))
        impl, reason = automatic_backward_choice(shape, dtype)
        lines.append(_decision_line("rms_norm backward", impl, reason, unsupported))
    return "\n".join(lines), healthy


def _decision_line(what: str, impl: str, reason: str | None, unsupported: str | None) -> str:
    if reason is not None and reason == unsupported:
        reason = "this device cannot run the kernels (above)"
    return textwrap.fill(f"{what:<17} {impl:<6} {reason or 'the kernel serves it'}", width=100,
                         initial_indent="    ", subsequent_indent=" " * 29)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxnorm.doctor",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--shape", type=parse_shape, action="append", default=[],
                        help="MxKxN or MxKxN1+N2+... (rows, hidden size, projection widths) "
                             "to report besides the model shapes; repeatable")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                        help="activation and weight dtype of the reported shapes "
                             "(default: bfloat16)")
    parser.add_argument("--no-residual", action="store_true",
                        help="report the post-norm ops without a residual input")
    parser.add_argument("--only-given", action="store_true",
                        help="report only the --shape shapes, not the model shapes")
    parser.add_argument("--interpret", action="store_true",
                        help="without a Hopper GPU, run the kernel check under the Pallas GPU "
                             "interpreter instead of skipping it (slow: minutes on a CPU)")
    args = parser.parse_args(argv)
    check_impl = "mosaic" if dispatch.hopper_or_newer() else None
    if args.interpret and check_impl is None:
        from pallas_kernels.interpreter_flags import use_interpreter_safe_xla_flags

        use_interpreter_safe_xla_flags()
        check_impl = "interpret"
    shapes = tuple(args.shape) + (() if args.only_given else MODEL_SHAPES)
    if not shapes:
        parser.error("--only-given needs at least one --shape")
    text, healthy = report(shapes, jnp.dtype(args.dtype), not args.no_residual, check_impl)
    print(text)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
