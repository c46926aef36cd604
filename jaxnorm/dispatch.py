"""Choosing an implementation per call, tokamax-style.

Each backend registers one function per op. A backend that cannot serve a
call raises `Unsupported(reason)`; with `impl=None` the dispatcher then falls
through to "xla" and remembers the reason, so `fallback_reasons()` tells the
user why the kernel did not run. With `impl="mosaic"` the reason is raised.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from typing import Any

import jax

from pallas_kernels import errors

logger = logging.getLogger("jaxnorm")

# Modules that register Mosaic GPU backends; imported on first use so that
# plain CPU users never pay for importing Pallas.
_MOSAIC_MODULES = ("jaxnorm.backends.mosaic_dense", "jaxnorm.backends.mosaic_norms")

_REGISTRY: dict[tuple[str, str], Callable[..., Any]] = {}
_DECLINE_AUTO: dict[str, Callable[..., str | None]] = {}
_FALLBACKS: dict[str, str] = {}


# The kernels' own error: one class from pallas_kernels up to the user (jaxnorm.Unsupported).
Unsupported = errors.Unsupported


def register(op: str, impl: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        _REGISTRY[(op, impl)] = fn
        return fn

    return decorate


def decline_automatic(*ops: str) -> Callable[[Callable[..., str | None]], Callable[..., str | None]]:
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
def hopper_or_newer() -> bool:
    """True when the default device is an NVIDIA GPU of compute capability >= 9.0."""
    device = jax.devices()[0]
    if device.platform != "gpu":
        return False
    capability = getattr(device, "compute_capability", "0.0")
    return float(capability) >= 9.0


def fallback_reasons() -> dict[str, str]:
    """Why each op last fell back from the Mosaic kernel to xla under impl=None."""
    return dict(_FALLBACKS)


def call(op: str, impl: str | None, *args: Any, **kwargs: Any) -> Any:
    """Run `op` with the requested implementation (None = automatic)."""
    if impl == "xla":
        return _REGISTRY[(op, "xla")](*args, **kwargs)
    if impl in ("mosaic", "interpret"):
        return _mosaic(op)(*args, interpret=impl == "interpret", **kwargs)
    if hopper_or_newer():
        try:
            kernel = _mosaic(op)
            declined = _DECLINE_AUTO.get(op, lambda *a, **k: None)(*args, **kwargs)
            if declined:
                raise Unsupported(declined)
            result = kernel(*args, interpret=False, **kwargs)
            _FALLBACKS.pop(op, None)
            return result
        except Unsupported as reason:
            _FALLBACKS[op] = str(reason)
            logger.info("jaxnorm.%s: Mosaic kernel not used (%s); using xla", op, reason)
    return _REGISTRY[(op, "xla")](*args, **kwargs)


def _mosaic(op: str) -> Callable[..., Any]:
    _load_mosaic_backends()
    try:
        return _REGISTRY[(op, "mosaic")]
    except KeyError:
        raise Unsupported(f"no Mosaic GPU kernel exists for {op}") from None
