"""Choosing an implementation per call, tokamax-style.

Each backend registers one function per op. A backend that cannot serve a
call raises `Unsupported(reason)`; with `impl=None` the dispatcher then falls
through to "xla" and remembers the reason, so `fallback_reasons()` tells the
user why the kernel did not run (on a machine without a Hopper GPU, that the
device cannot run it). With `impl="mosaic"` the reason is raised.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import jax

from jaxnorm import callers_rows
from pallas_kernels import errors

logger = logging.getLogger("jaxnorm")

# Modules that register Mosaic GPU backends; imported on first use so that
# plain CPU users never pay for importing Pallas.
_MOSAIC_MODULES = ("jaxnorm.backends.mosaic_dense", "jaxnorm.backends.mosaic_norms",
                   "jaxnorm.backends.mosaic_residual", "jaxnorm.backends.mosaic_gated",
                   "jaxnorm.backends.mosaic_attention_input",
                   "jaxnorm.backends.mosaic_norm_backward")

_REGISTRY: dict[tuple[str, str], Callable[..., Any]] = {}
_DECLINE_AUTO: dict[str, Callable[..., str | None]] = {}
# Per op: (implementation, why xla) of its last impl=None call.
_CHOICES: dict[str, tuple[str, str | None]] = {}
# The open `recorded_choices` blocks' records.
_RECORDS: list[dict[str, list[tuple[str, str | None]]]] = []
# Whether the op being traced was called with impl=None (`automatic_scope`).
_AUTOMATIC = contextvars.ContextVar("jaxnorm_automatic", default=False)


# The kernels' own error: one class from pallas_kernels up to the user (jaxnorm.Unsupported).
Unsupported = errors.Unsupported


def register(op: str, impl: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        _REGISTRY[(op, impl)] = fn
        return fn

    return decorate


def decline_automatic(
    *ops: str,
) -> Callable[[Callable[..., str | None]], Callable[..., str | None]]:
    """Register a check of `ops` run only under impl=None: a reason string keeps the kernel out.

    For shapes a kernel serves correctly but was measured slower than xla at;
    impl="mosaic" still runs it, so it stays tested and benchmarked.
    """

    def decorate(fn: Callable[..., str | None]) -> Callable[..., str | None]:
        for op in ops:
            _DECLINE_AUTO[op] = fn
        return fn

    return decorate


@functools.cache
def _load_mosaic_backends() -> None:
    for name in _MOSAIC_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise


@functools.cache
def device_unsupported_reason() -> str | None:
    """Why the default device cannot run the Mosaic GPU kernels, or None when it can."""
    device = jax.devices()[0]
    if device.platform != "gpu":
        kind = "" if device.device_kind == device.platform else f" ({device.device_kind})"
        return (f"the default device is {device.platform}{kind}; the Mosaic kernels need an "
                "NVIDIA GPU of compute capability >= 9.0 (Hopper)")
    capability = getattr(device, "compute_capability", None)
    if capability is None:
        return (f"the default GPU ({device.device_kind}) reports no compute capability; the "
                "Mosaic kernels need an NVIDIA GPU of compute capability >= 9.0 (Hopper)")
    if float(capability) < 9.0:
        return (f"the default GPU ({device.device_kind}) has compute capability {capability}; "
                "the Mosaic kernels need >= 9.0 (Hopper)")
    return None


# Device kinds of Hopper-or-newer NVIDIA parts, as an abstract mesh's device names them.
_HOPPER_OR_NEWER_KINDS = re.compile(r"\b(G?H(100|200|800|20)|G?B(100|200|300))\b", re.I)


def planned_for_hopper() -> bool:
    """True under an abstract mesh whose device is a Hopper-or-newer GPU by its kind
    (`jax.sharding.use_abstract_mesh`): a program lowered for "cuda" on any host is then
    planned, and dispatched, as on that GPU (`bench.decode_plan` does)."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    return (device is not None and device.platform == "gpu"
            and _HOPPER_OR_NEWER_KINDS.search(device.device_kind or "") is not None)


def hopper_or_newer() -> bool:
    """True when the default device is an NVIDIA GPU of compute capability >= 9.0, or the
    program is planned for one (`planned_for_hopper`)."""
    return planned_for_hopper() or device_unsupported_reason() is None


def fallback_reasons() -> dict[str, str]:
    """Why each op's last automatic (impl=None) dispatch ran xla instead of the Mosaic kernel.

    Dispatch happens when JAX traces the op, so under `jax.jit` this is the
    decision of the last trace. An op whose last automatic call ran the kernel
    is absent, as is one only ever called with an explicit `impl`.
    """
    return {op: reason for op, (impl, reason) in _CHOICES.items() if impl == "xla"}


@contextlib.contextmanager
def recorded_choices() -> Iterator[dict[str, list[tuple[str, str | None]]]]:
    """A dict that fills with the automatic (impl=None) decisions made inside the block: per
    op each distinct (implementation, why xla or None) in the order first made (one per
    call site's shape), none of those made before the block."""
    record: dict[str, list[tuple[str, str | None]]] = {}
    _RECORDS.append(record)
    try:
        yield record
    finally:
        _RECORDS.remove(record)


def last_automatic_choice(op: str) -> tuple[str, str | None] | None:
    """(implementation, why xla or None) of `op`'s last impl=None call; None before any.

    `jax.eval_shape` of an op with impl=None makes this decision without computing.
    """
    return _CHOICES.get(op)


def resolve(op: str, impl: str | None, *args: Any, **kwargs: Any) -> str:
    """The implementation `call(op, impl, ...)` runs: "xla", "mosaic" or "interpret".

    Under impl=None the kernel is chosen only on Hopper-or-newer GPUs, where no
    decline rule objects and where tracing it for these shapes raises no
    `Unsupported`; otherwise the reason is recorded for `fallback_reasons()`.
    Resolving before autodiff lets the ops differentiate the xla path exactly
    as JAX differentiates the stock layers (`jaxnorm.autodiff`).
    """
    if impl is not None:
        return impl
    chosen, reason = decide(op, *args, **kwargs)
    if reason is None:
        _chose(op, (chosen, None))
    else:
        _fell_back(op, reason)
    return chosen


def decide(op: str, *args: Any, **kwargs: Any) -> tuple[str, str | None]:
    """(what impl=None picks for these arguments, why xla or None), recording nothing: the
    decision `resolve` makes and records."""
    if not hopper_or_newer():
        return "xla", device_unsupported_reason() or "no Hopper GPU"
    try:
        kernel = _mosaic(op)
        declined = _DECLINE_AUTO.get(op, lambda *a, **k: None)(*args, **kwargs)
        if declined:
            raise Unsupported(declined)
        jax.eval_shape(functools.partial(kernel, interpret=False, **kwargs), *args)
    except Unsupported as reason:
        return "xla", str(reason)
    return "mosaic", None


@contextlib.contextmanager
def automatic_scope(automatic: bool) -> Iterator[None]:
    """Mark what is traced inside as part of a public op called with impl=None (True) or with
    an explicit impl (False), for the decisions its xla formulation makes itself
    (`norm_backward_kernel`): an explicit impl="xla" stays pure JAX."""
    token = _AUTOMATIC.set(automatic)
    try:
        yield
    finally:
        _AUTOMATIC.reset(token)


def norm_backward_kernel(x: Any, scale: Any, *, eps: float, scale_offset: float,
                         addend: bool = False, cotangents: int = 1) -> bool:
    """Whether RMSNorm's backward kernel differentiates the xla formulation's norm of x being
    traced: inside a public op called with impl=None (`automatic_scope`), where automatic
    dispatch takes "rms_norm_backward" for x's rows. Decided without recording (inference
    makes the same trace); a training step's backward records it when it runs the kernel.
    Elsewhere the norm stays the stock graph, forward-mode autodiff included. `addend`: the
    kernel would also add x's other cotangent (the residual stream's) to dx; `cotangents`:
    it would sum that many cotangents of the normed x (one per consumer of it)."""
    if not _AUTOMATIC.get():
        return False
    g = x if cotangents == 1 else (x,) * cotangents
    args = (x, g, scale, x) if addend else (x, g, scale)
    return decide("rms_norm_backward", *args, eps=eps, scale_offset=scale_offset)[0] != "xla"


def call(op: str, impl: str | None, *args: Any, **kwargs: Any) -> Any:
    """Run `op` with the requested implementation (None = automatic, see `resolve`)."""
    impl = resolve(op, impl, *args, **kwargs)
    if impl == "xla":
        return _REGISTRY[(op, "xla")](*args, **kwargs)
    return _mosaic(op)(*args, interpret=impl == "interpret", **kwargs)


def call_xla_in_callers_rows(op: str, lead: tuple[int, ...] | None, x: Any, *args: Any,
                             **kwargs: Any) -> Any:
    """The xla implementation of `op` on x [M, K] reshaped to the caller's leading dims
    `lead` (`jaxnorm.callers_rows`), its outputs as rows again."""
    outs = call(op, "xla", callers_rows.shaped(x, lead), *args, **kwargs)
    return callers_rows.flat_outputs(outs, lead)


def call_with_xla_backward(op: str, impl: str, *args: Any, return_input: bool = False,
                           **kwargs: Any) -> Any:
    """`call(op, impl, ...)` differentiated as the xla implementation: JAX's VJP of it, which
    recomputes what it needs, so a forward-only kernel serves under autodiff. kwargs are
    static (hashable). `return_input`: x (the first argument) after the outputs, its
    cotangent given to the xla implementation's VJP (called with return_input=True)."""
    return _with_xla_vjp(op, impl, tuple(sorted(kwargs.items())), return_input,
                         _AUTOMATIC.get(), args)


def call_with_stock_backward(op: str, impl: str, *args: Any, return_input: bool = False,
                             lead: tuple[int, ...] | None = None, **kwargs: Any) -> Any:
    """`call(op, impl, ..., stats)` whose last argument is x's own row statistics, chosen by
    impl=None: the kernel serves the primal (inference), and under differentiation the op is
    stock's graph, forward and backward (JAX's VJP of the xla implementation without the
    statistics, the norm reducing x), as `jaxnorm.autodiff` differentiates every op whose
    kernel impl=None chose: a training step gains nothing from a forward whose normalized
    input its backward must form again. The statistics get no cotangent and are not read,
    so under jit their producer's reduction is dropped; stock's graph runs on x in the
    caller's shape, `lead` its leading dims (`jaxnorm.callers_rows`). kwargs are static
    (hashable); `return_input` as `call_with_xla_backward`."""
    return _stock_when_differentiated(op, impl, tuple(sorted(kwargs.items())), return_input,
                                      _AUTOMATIC.get(), lead, args)


def _call_returning_input(op: str, impl: str, kwargs: tuple, return_input: bool,
                          args: tuple) -> Any:
    out = call(op, impl, *args, **dict(kwargs))
    return (*out, args[0]) if return_input else out


def _xla_vjp(op: str, kwargs: tuple, return_input: bool, automatic: bool, args: tuple,
             lead: tuple[int, ...] | None = None) -> tuple[Any, Callable[..., Any]]:
    """(outputs, VJP) of the xla implementation at `args` (x, the first, computed on in the
    shape `lead` gives, the outputs as rows), traced in the op's `automatic_scope` (a VJP
    traced later, in the backward, needs it restored)."""
    extra = {"return_input": True} if return_input else {}

    with automatic_scope(automatic):
        return jax.vjp(lambda a: call_xla_in_callers_rows(op, lead, *a, **dict(kwargs), **extra),
                       args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4))
def _with_xla_vjp(op: str, impl: str, kwargs: tuple, return_input: bool, automatic: bool,
                  args: tuple) -> Any:
    return _call_returning_input(op, impl, kwargs, return_input, args)


def _with_xla_vjp_fwd(op: str, impl: str, kwargs: tuple, return_input: bool, automatic: bool,
                      args: tuple):
    return _call_returning_input(op, impl, kwargs, return_input, args), args


def _with_xla_vjp_bwd(op: str, impl: str, kwargs: tuple, return_input: bool, automatic: bool,
                      args: tuple, cotangents):
    _, vjp = _xla_vjp(op, kwargs, return_input, automatic, args)
    return vjp(cotangents)


_with_xla_vjp.defvjp(_with_xla_vjp_fwd, _with_xla_vjp_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4, 5))
def _stock_when_differentiated(op: str, impl: str, kwargs: tuple, return_input: bool,
                               automatic: bool, lead: tuple[int, ...] | None, args: tuple) -> Any:
    return _call_returning_input(op, impl, kwargs, return_input, args)


def _stock_when_differentiated_fwd(op: str, impl: str, kwargs: tuple, return_input: bool,
                                   automatic: bool, lead: tuple[int, ...] | None, args: tuple):
    return _xla_vjp(op, kwargs, return_input, automatic, args[:-1], lead)


def _stock_when_differentiated_bwd(op: str, impl: str, kwargs: tuple, return_input: bool,
                                   automatic: bool, lead: tuple[int, ...] | None,
                                   vjp: Callable[..., Any], cotangents):
    (grads,) = vjp(cotangents)
    return ((*grads, None),)


_stock_when_differentiated.defvjp(_stock_when_differentiated_fwd,
                                  _stock_when_differentiated_bwd)


def _chose(op: str, choice: tuple[str, str | None]) -> None:
    _CHOICES[op] = choice
    for record in _RECORDS:
        if choice not in (made := record.setdefault(op, [])):
            made.append(choice)


def _fell_back(op: str, reason: str) -> None:
    if _CHOICES.get(op) != ("xla", reason):
        logger.info("jaxnorm.%s: Mosaic kernel not used (%s); using xla", op, reason)
    _chose(op, ("xla", reason))


def _mosaic(op: str) -> Callable[..., Any]:
    _load_mosaic_backends()
    try:
        return _REGISTRY[(op, "mosaic")]
    except KeyError:
        raise Unsupported(f"no Mosaic GPU kernel exists for {op}") from None
