"""Every op under `jax.jit` with sharded inputs (no shard_map), values, gradients, HLO.

Explicit meshes (jax.make_mesh's default) run each op inside jaxnorm's internal
shard_map; Auto meshes hand the xla path to XLA's partitioner and the kernel
path to the custom_partitioning rule, whose per-device programs are traced here
(the Pallas interpreter's ordered callbacks cannot run inside a multi-device
program, so the kernels themselves run in tests/test_sharding_ops.py's
one-device-per-shard form only where the interpreter allows). Run by
tests/test_sharding.py on 8 host devices.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from test_sharding import requires_host_devices
from test_sharding_ops import (CALLS, CASES, EPS, M, _differentiable, _spec_tree,
                               assert_matches_reference, make_inputs, specs)

from bench.collectives import compiled_collectives
import jaxnorm
from jaxnorm import partitioning
from pallas_kernels import decode_matmul

pytestmark = requires_host_devices()


def mesh(axis_type: AxisType):
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2)


def place(tree, spec_tree, on):
    return jax.tree.map(
        lambda spec, a: None if a is None else jax.device_put(a, NamedSharding(on, spec)),
        spec_tree, tree, is_leaf=lambda v: v is None or isinstance(v, P))


def jitted_vjp(op: str, layout: str, inputs: dict, axis_type: AxisType, impl: str = "xla"):
    """(outputs, grads, judged dys, fn, args) of `jax.vjp` under jit on sharded inputs."""
    in_specs, out_spec, _ = specs(op, layout)
    on = mesh(axis_type)
    diff = _differentiable(inputs)
    shapes = jax.eval_shape(lambda a: CALLS[op](a, eps=EPS, impl="xla"), diff)
    rng = np.random.default_rng(1)
    dys = jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape), s.dtype), shapes)
    if op.startswith("dense_"):
        dys = (dys[0], jnp.zeros_like(dys[1]))

    def step(a, dy):
        out, vjp = jax.vjp(lambda p: CALLS[op](p, eps=EPS, impl=impl), a)
        return out, vjp(dy)[0]

    args = (place(diff, _spec_tree(diff, in_specs), on),
            place(dys, jax.tree.map(lambda _: out_spec, shapes), on))
    out, grads = jax.jit(step)(*args)
    judged = [dys[0]] if op.startswith("dense_") else list(jax.tree.leaves(dys))
    return out, grads, judged, step, args


@pytest.mark.parametrize(("op", "layout"), CASES)
def test_explicit_mesh_values_and_gradients(op, layout):
    inputs = make_inputs(op)
    out, grads, dys, _, _ = jitted_vjp(op, layout, inputs, AxisType.Explicit)
    assert_matches_reference(op, inputs, out, grads, dys)


@pytest.mark.parametrize(("op", "layout"), CASES)
def test_auto_mesh_values_and_gradients(op, layout):
    inputs = make_inputs(op)
    out, grads, dys, _, _ = jitted_vjp(op, layout, inputs, AxisType.Auto)
    assert_matches_reference(op, inputs, out, grads, dys)


@pytest.mark.parametrize(("op", "layout"), CASES)
def test_explicit_mesh_never_gathers_x(op, layout):
    """The internal shard_map moves what tests/test_sharding_ops.py's layouts move: no
    all-gather of x, whatever the layout."""
    inputs = make_inputs(op)
    _, _, _, step, args = jitted_vjp(op, layout, inputs, AxisType.Explicit)
    found = compiled_collectives(step, *args)
    x_rows = {s for c in found if c.kind == "all-gather" for _, s in c.arrays}
    assert not x_rows, [c.describe() for c in found]


@pytest.mark.parametrize("op", ["rms_norm_dense", "layer_norm_dense"])
def test_kernel_path_row_parallel_rule_moves_statistics_and_outputs(op):
    """Auto mesh, impl="interpret", K sharded: the partitioning rule's per-device program
    all-reduces [M] statistics and the float32 outputs, and gathers nothing."""
    inputs = make_inputs(op, dtype=ml_dtypes.bfloat16, kind="normal", k=128, n=64)
    in_specs, out_spec, _ = specs(op, "row")
    on = mesh(AxisType.Auto)
    diff = _differentiable(inputs)
    fn = jax.jit(lambda a: CALLS[op](a, eps=EPS, impl="interpret"))
    args = place(diff, _spec_tree(diff, in_specs), on)
    found = compiled_collectives(fn, args)
    assert all(c.kind == "all-reduce" for c in found), [c.describe() for c in found]
    stats = [s for c in found for _, s in c.arrays if s == (M // 2,)]
    outputs = [(d, s) for c in found for d, s in c.arrays if s != (M // 2,)]
    assert len(stats) == (1 if op == "rms_norm_dense" else 3), [c.describe() for c in found]
    assert outputs == [("f32", (M // 2, 64))] * 2, [c.describe() for c in found]
    assert_matches_reference_values(op, inputs, fn(args))


def assert_matches_reference_values(op, inputs, out):
    from verify import checks
    from verify.references import f64

    for j, y in zip(checks.judge(op, "xla", inputs), jax.tree.leaves(out)):
        assert np.all(np.abs(f64(np.asarray(y)) - j.expected) <= j.tolerance), j.name


def _per_device_program(op: str, inputs: dict, in_specs: dict):
    """The jaxpr the custom_partitioning rule lowers on each device, for these shardings."""
    on = mesh(AxisType.Auto)
    diff = _differentiable(inputs)
    args = place(diff, _spec_tree(diff, in_specs), on)
    call_args = {"rms_norm": lambda a: (a["x"], a["scale"]),
                 "rms_norm_dense": lambda a: (a["x"], a["scale"], tuple(a["kernel"]),
                                              tuple(a["bias"]))}[op](args)
    leaves, treedef = jax.tree.flatten(call_args)
    roles, out_roles = partitioning._roles(op, call_args)
    kwargs = {"eps": EPS, "scale_offset": 0.0}
    static = partitioning._Call(op, "interpret", tuple(sorted(kwargs.items())), treedef,
                                tuple(jax.tree.leaves(roles)), out_roles)
    shapes = [jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for v in leaves]
    _, lower, out_shardings, arg_shardings = partitioning._partition(static, on, shapes, None)
    local = [jax.ShapeDtypeStruct(s.shard_shape(v.shape), v.dtype)
             for s, v in zip(arg_shardings, leaves)]
    jaxpr = jax.make_jaxpr(lower, axis_env=list(on.shape.items()))(*local)
    return jaxpr, [s.spec for s in arg_shardings], [s.spec for s in out_shardings]


@pytest.mark.parametrize(("op", "layout"), [("rms_norm_dense", "data"),
                                            ("rms_norm_dense", "column"),
                                            ("rms_norm", "data")])
def test_kernel_path_rule_runs_the_kernel_per_device_without_collectives(op, layout):
    """Batch- or column-sharded: each device runs the Mosaic kernel (here under the
    interpreter) on its own block, and the rule asks for no collective and no gather."""
    inputs = make_inputs(op, dtype=ml_dtypes.bfloat16, kind="normal", m=16, k=64, n=256)
    if op == "rms_norm_dense":
        inputs["kernel"], inputs["bias"] = inputs["kernel"][:1], inputs["bias"][:1]
    in_specs, out_spec, _ = specs(op, layout)
    jaxpr, arg_specs, out_specs = _per_device_program(op, inputs, in_specs)
    assert arg_specs[0] == P("data", None) and out_specs[0] == out_spec
    text = str(jaxpr)  # with the nested jaxprs: the kernel's body takes global-memory refs
    assert "Ref<gmem>{bf16[8,64]}" in text  # ... of this device's 8 of the 16 rows of x
    if layout == "column":
        assert "Ref<gmem>{bf16[64,64]}" in text  # ... and its 64 of the kernel's 256 columns
    assert not any(c in text for c in ("psum", "all_gather", "all_to_all", "ppermute")), text


def test_kernel_path_vmaps_on_a_many_device_host():
    """custom_partitioning has no batching rule: under vmap the op runs as on one device."""
    x = make_inputs("rms_norm", dtype=ml_dtypes.bfloat16, kind="normal", m=48, k=64)["x"]
    scale = make_inputs("rms_norm", k=64)["scale"]
    y = jax.vmap(lambda a: CALLS["rms_norm"]({"x": a, "scale": scale}, eps=EPS,
                                             impl="interpret"))(x.reshape(3, 16, 64))
    assert_matches_reference_values("rms_norm", {"x": x, "scale": scale, "eps": EPS},
                                    y.reshape(48, 64))


def _post_norm_with_statistics(x, w, g, r, impl):
    h, stats = jaxnorm.dense_rms_norm(x, w, None, g, residual_after=r,
                                      return_statistics=True, impl=impl)
    return h, stats.mean, stats.m2


def _statistics_inputs(dtype, rows=M):
    rng = np.random.default_rng(7)
    return (jnp.asarray(rng.standard_normal((rows, 64)), dtype),
            jnp.asarray(rng.standard_normal((64, 256)) / 8, dtype),
            jnp.asarray(1.0 + 0.2 * rng.standard_normal(256), jnp.float32),
            jnp.asarray(rng.standard_normal((rows, 256)) + 100.0, dtype))


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto])
def test_post_norm_statistics_with_rows_sharded(axis_type):
    """return_statistics=True with M sharded: h and its (mean, M2) as on one device (xla)."""
    args = _statistics_inputs(jnp.float32)
    on = mesh(axis_type)
    placed = [jax.device_put(a, NamedSharding(on, spec)) for a, spec in
              zip(args, (P("data", None), P(), P(), P("data", None)))]
    with jax.set_mesh(on):
        got = jax.jit(lambda *a: _post_norm_with_statistics(*a, "xla"))(*placed)
    for a, b in zip(got, _post_norm_with_statistics(*args, "xla")):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-3)


def test_post_norm_statistics_refuse_an_explicit_n_sharding():
    args = _statistics_inputs(jnp.float32)
    on = mesh(AxisType.Explicit)
    placed = [jax.device_put(a, NamedSharding(on, spec)) for a, spec in
              zip(args, (P("data", None), P(None, "model"), P("model"), P("data", "model")))]
    with jax.set_mesh(on), pytest.raises(ValueError, match="not served with the output's N"):
        jax.jit(lambda *a: _post_norm_with_statistics(*a, "xla"))(*placed)


def test_kernel_path_rule_psums_post_norm_statistics_over_n():
    """Auto mesh, impl="interpret", N sharded: the rule's per-device program (float32
    columns of h, statistics psum-ed two-pass) gives the one-device kernel's h and
    statistics. Rows above the decode path's (which rounds the product to x's dtype
    before the residual, as a dot does), so both keep h's product in float32."""
    args = _statistics_inputs(jnp.bfloat16, rows=2 * decode_matmul.MAX_ROWS)
    on = mesh(AxisType.Auto)
    placed = [jax.device_put(a, NamedSharding(on, spec)) for a, spec in
              zip(args, (P("data", None), P(None, "model"), P("model"), P("data", "model")))]
    with jax.set_mesh(on):
        got = jax.jit(lambda *a: _post_norm_with_statistics(*a, "interpret"))(*placed)
    h, mean, m2 = _post_norm_with_statistics(*args, "interpret")
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(h))
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(mean), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got[2]), np.asarray(m2), rtol=1e-5)
