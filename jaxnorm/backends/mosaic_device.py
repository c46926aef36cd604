"""Whether this machine can run the Mosaic GPU kernels, asked where it can be answered.

At trace time a kernel call cannot tell running on this host from lowering for
"cuda" on it (compile checks from a CPU host), so the check that needs the
platform sits in the lowering: `on_gpu_only` puts an identity on its operand whose
lowering raises `Unsupported` for every platform but "cuda". An attached GPU older
than Hopper is refused at trace time.
"""

from __future__ import annotations

import functools

import jax
from jax.extend import core as jex_core
from jax.interpreters import batching, mlir

from pallas_kernels.errors import Unsupported

_MIN_CAPABILITY = 9.0  # wgmma, TMA and clusters: Hopper (sm_90) and newer

_gpu_only_p = jex_core.Primitive("jaxnorm_mosaic_gpu_only")
# Outside jit the primitive runs as a jitted call of itself, so the lowering decides.
_gpu_only_p.def_impl(lambda x, *, op: jax.jit(functools.partial(_gpu_only_p.bind, op=op))(x))
_gpu_only_p.def_abstract_eval(lambda x, *, op: x)
batching.primitive_batchers[_gpu_only_p] = lambda args, dims, *, op: (
    _gpu_only_p.bind(args[0], op=op), dims[0])


def _refuse(ctx, x, *, op: str):
    platforms = ", ".join(ctx.module_context.platforms)
    raise Unsupported(
        f"{op}: impl='mosaic' runs Mosaic GPU kernels, which need an NVIDIA GPU of compute "
        f"capability >= {_MIN_CAPABILITY} (Hopper); this call is compiled for {platforms}. "
        "impl='interpret' runs the same kernels under the Pallas GPU interpreter; impl=None "
        "falls back to xla")


mlir.register_lowering(_gpu_only_p, lambda ctx, x, *, op: [x], platform="cuda")
mlir.register_lowering(_gpu_only_p, _refuse)


def on_gpu_only(x: jax.Array, op: str) -> jax.Array:
    """x, checked to run on a GPU that serves the kernels (Unsupported with the reason if not).

    Under an abstract mesh of a GPU the call is planned for that device and passes as is;
    otherwise an attached GPU older than Hopper is refused now, and any platform but
    "cuda" when the call is compiled (a CPU host may still lower it for "cuda")."""
    abstract_device = jax.sharding.get_abstract_mesh().abstract_device
    if abstract_device is not None and abstract_device.platform == "gpu":
        return x
    device = jax.devices()[0]
    if device.platform == "gpu":
        capability = float(getattr(device, "compute_capability", "0.0"))
        if capability < _MIN_CAPABILITY:
            raise Unsupported(f"{op}: the Mosaic GPU kernels need compute capability >= "
                              f"{_MIN_CAPABILITY} (Hopper); {device.device_kind} has "
                              f"{capability}")
    return _gpu_only_p.bind(x, op=op)
