"""Every op inside `jax.shard_map` (check_vma=True), values and gradients, on a 2 x 4 mesh.

Layouts ("data" splits rows, "model" splits a feature axis):
- data: x's rows sharded, every parameter replicated (gradients psum-ed by JAX);
- column: the kernels' N sharded, x whole on each "model" shard; the post-norm
  ops normalize the split output rows with `axis_name` (statistics psum-ed);
- row: x's K sharded with the gains and the kernels' rows, `axis_name="model"`.
Values are judged against verify's float64 reference with the tolerance of the
unsharded call, gradients with `check_grads_of`; the compiled HLO is read for
what moves. Run by tests/test_sharding.py on 8 host devices.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from test_sharding import requires_host_devices

import jaxnorm
from bench.collectives import compiled_collectives
from verify import checks, strategies
from verify.references import f64

pytestmark = requires_host_devices()

M, K, N = 12, 32, 16  # distinct local sizes: rows 6, K/4 = 8, N/4 = 4
EPS = 1e-5

CALLS = {
    "rms_norm": lambda a, **kw: jaxnorm.rms_norm(a["x"], a.get("scale"), **kw),
    "layer_norm": lambda a, **kw: jaxnorm.layer_norm(a["x"], a.get("scale"), a.get("bias"), **kw),
    "rms_norm_dense": lambda a, **kw: jaxnorm.rms_norm_dense(
        a["x"], a.get("scale"), a["kernel"], a.get("bias"), **kw),
    "layer_norm_dense": lambda a, **kw: jaxnorm.layer_norm_dense(
        a["x"], a.get("scale"), a.get("norm_bias"), a["kernel"], a.get("bias"), **kw),
    "dense_rms_norm": lambda a, **kw: jaxnorm.dense_rms_norm(
        a["x"], a["kernel"], a.get("bias"), a.get("scale"), residual=a.get("residual"), **kw),
    "dense_layer_norm": lambda a, **kw: jaxnorm.dense_layer_norm(
        a["x"], a["kernel"], a.get("bias"), a.get("scale"), a.get("norm_bias"),
        residual=a.get("residual"), **kw),
}
LAYOUTS = {
    "rms_norm": ("data", "row"), "layer_norm": ("data", "row"),
    "rms_norm_dense": ("data", "column", "row"), "layer_norm_dense": ("data", "column", "row"),
    "dense_rms_norm": ("data", "column"), "dense_layer_norm": ("data", "column"),
}
CASES = [(op, layout) for op, layouts in LAYOUTS.items() for layout in layouts]


def mesh():
    return jax.make_mesh((2, 4), ("data", "model"))


def make_inputs(op: str, dtype=np.float32, kind: str = "large_mean", seed: int = 0,
                m: int = M, k: int = K, n: int = N) -> dict:
    """Full (unsharded) inputs: x with large-mean rows (LayerNorm's shift matters), gains near 1,
    two kernels sharing the pre-norm, a residual for post-norm."""
    rng = np.random.default_rng(seed)
    x = strategies.rows(rng, m, k, np.dtype(dtype), kind)

    def vec(length, centre=0.0):
        return (centre + 0.3 * rng.standard_normal(length)).astype(np.float32)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(dtype)

    if op in ("rms_norm", "layer_norm"):
        inputs = {"x": x, "scale": vec(k, 1.0)}
        if op == "layer_norm":
            inputs["bias"] = vec(k)
    elif op.endswith("_norm_dense"):
        inputs = {"x": x, "scale": vec(k, 1.0), "kernel": [mat(k, n), mat(k, n)],
                  "bias": [vec(n), vec(n)]}
        if op == "layer_norm_dense":
            inputs["norm_bias"] = vec(k)
    else:
        inputs = {"x": x, "kernel": mat(k, n), "bias": vec(n), "scale": vec(n, 1.0),
                  "residual": rng.standard_normal((m, n)).astype(dtype)}
        if op == "dense_layer_norm":
            inputs["norm_bias"] = vec(n)
    return {**inputs, "eps": EPS}


def specs(op: str, layout: str) -> tuple[dict, object, str | None]:
    """(in_specs by input name, out_specs, axis_name) of an op in a layout."""
    rows = P("data", None)
    if layout == "data":
        spec = {"x": rows, "residual": rows}
        return spec, rows, None
    if op.endswith("_norm_dense"):
        if layout == "column":
            cols = P(None, "model")
            return {"x": rows, "kernel": [cols, cols], "bias": [P("model")] * 2}, \
                P("data", "model"), None
        return {"x": P("data", "model"), "scale": P("model"), "norm_bias": P("model"),
                "kernel": [P("model", None)] * 2, "bias": [P(), P()]}, rows, "model"
    if op.startswith("dense_"):  # column-parallel post-norm: the output rows split on N
        n_vec = P("model")
        return {"x": rows, "kernel": P(None, "model"), "bias": n_vec, "scale": n_vec,
                "norm_bias": n_vec, "residual": P("data", "model")}, P("data", "model"), "model"
    return {"x": P("data", "model"), "scale": P("model"), "bias": P("model")}, \
        P("data", "model"), "model"


def place(tree, spec_tree):
    """Arrays put on the mesh as their specs say (shard_map takes them as they lie)."""
    sharding = lambda spec: jax.sharding.NamedSharding(mesh(), spec)  # noqa: E731
    return jax.tree.map(lambda spec, a: None if a is None else jax.device_put(a, sharding(spec)),
                        spec_tree, tree, is_leaf=lambda v: v is None or isinstance(v, P))


def _spec_tree(diff: dict, in_specs: dict) -> dict:
    """One spec per input leaf (a list of kernels takes the first len(list) specs)."""
    return {name: in_specs.get(name, P()) if not isinstance(v, list)
            else in_specs.get(name, [P()] * len(v))[:len(v)] for name, v in diff.items()}


def _differentiable(inputs: dict) -> dict:
    return {name: jax.tree.map(jnp.asarray, v) for name, v in inputs.items()
            if name != "eps" and v is not None}


def sharded_vjp(op: str, layout: str, inputs: dict, impl: str = "xla"):
    """(outputs, grads, dys, jitted fn, args): `jax.vjp` of the op inside shard_map, with
    cotangents drawn for the whole outputs and sharded like them."""
    in_specs, out_spec, axis_name = specs(op, layout)
    diff = _differentiable(inputs)
    diff_specs = _spec_tree(diff, in_specs)
    kw = dict(eps=inputs["eps"], impl=impl, axis_name=axis_name)
    shapes = jax.eval_shape(lambda a: CALLS[op](a, eps=EPS, impl="xla"), diff)
    rng = np.random.default_rng(1)
    dys = jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape), s.dtype), shapes)
    post_with_sum = op.startswith("dense_")
    if post_with_sum:  # judge the normed output; the pre-norm sum gets a zero cotangent
        dys = (dys[0], jnp.zeros_like(dys[1]))
    out_specs = jax.tree.map(lambda _: out_spec, shapes)

    def local(a, dy):
        out, vjp = jax.vjp(lambda p: CALLS[op](p, **kw), a)
        (grads,) = vjp(dy)
        return out, grads

    fn = jax.jit(jax.shard_map(local, mesh=mesh(), in_specs=(diff_specs, out_specs),
                               out_specs=(out_specs, diff_specs)))
    args = (place(diff, diff_specs), place(dys, out_specs))
    out, grads = fn(*args)
    judged_dys = [dys[0]] if post_with_sum else list(jax.tree.leaves(dys))
    return out, grads, judged_dys, fn, args


def assert_matches_reference(op: str, inputs: dict, out, grads, dys) -> None:
    """Values within the tolerance of the unsharded call's reference, gradients normwise."""
    judged = checks.judge(op, "xla", inputs)
    for j, y in zip(judged, jax.tree.leaves(out)):
        err = np.abs(f64(np.asarray(y)) - j.expected)
        worst = np.max(err / j.tolerance)
        assert np.all(err <= j.tolerance), f"{op} {j.name}: worst error / tolerance {worst}"
    assert checks.check_grads_of(op, grads, [f64(np.asarray(d)) for d in dys], **inputs) <= 1.0


@pytest.mark.parametrize(("op", "layout"), CASES)
def test_values_and_gradients_match_unsharded(op, layout):
    inputs = make_inputs(op)
    out, grads, dys, _, _ = sharded_vjp(op, layout, inputs)
    assert_matches_reference(op, inputs, out, grads, dys)


def _activation_shapes(op: str, layout: str) -> set[tuple[int, ...]]:
    """The only collectives over this shard's rows each layout needs: none for data parallel;
    [M] statistics and [M, N] output partials for row-parallel; [M] statistics (post-norm)
    and the [M, K] sum of the N-shards' dx (Megatron's all-reduce in the backward) for
    column-parallel."""
    rows = M // 2
    if layout == "data":
        return set()
    if layout == "row":
        return {(rows,), (rows, N)} if op.endswith("_dense") else {(rows,)}
    return {(rows,), (rows, K)}


@pytest.mark.parametrize(("op", "layout"), CASES)
def test_collectives_are_statistics_outputs_and_gradients(op, layout):
    """No all-gather at all; over this shard's rows only what `_activation_shapes` names (the
    rest are parameter gradients summed over the batch shards): never x gathered."""
    inputs = make_inputs(op)
    _, _, _, fn, args = sharded_vjp(op, layout, inputs)
    found = compiled_collectives(fn, *args)
    assert all(c.kind == "all-reduce" for c in found), [c.describe() for c in found]
    over_rows = {s for c in found for _, s in c.arrays if s[0] == M // 2}
    assert over_rows <= _activation_shapes(op, layout), [c.describe() for c in found]
    if layout == "data":
        assert found, "replicated parameters' gradients must be summed over the batch shards"


@pytest.mark.parametrize("op", ["rms_norm_dense", "layer_norm_dense"])
def test_row_parallel_forward_moves_statistics_and_outputs_only(op):
    """The forward of the row-parallel dense ops: all-reduces of [M_local] statistics (one for
    RMSNorm, shift / mean / M2 for LayerNorm) and one of the float32 outputs."""
    inputs = make_inputs(op)
    in_specs, out_spec, axis = specs(op, "row")
    diff = _differentiable(inputs)

    def forward(a):
        return CALLS[op](a, eps=EPS, impl="xla", axis_name=axis)

    fn = jax.shard_map(forward, mesh=mesh(), in_specs=(_spec_tree(diff, in_specs),),
                       out_specs=(out_spec, out_spec))
    found = compiled_collectives(fn, place(diff, _spec_tree(diff, in_specs)))
    stats = [c for c in found if all(s == (M // 2,) for _, s in c.arrays)]
    outputs = [c for c in found if c not in stats]
    assert len(stats) == (1 if op == "rms_norm_dense" else 3), [c.describe() for c in found]
    assert sum(len(c.arrays) for c in outputs) == 2, [c.describe() for c in found]
    assert all(d == "f32" and s == (M // 2, N) for c in outputs for d, s in c.arrays)


def test_bfloat16_row_parallel_layer_norm_with_large_means():
    inputs = make_inputs("layer_norm_dense", dtype=ml_dtypes.bfloat16, seed=3)
    out, grads, dys, _, _ = sharded_vjp("layer_norm_dense", "row", inputs)
    assert_matches_reference("layer_norm_dense", inputs, out, grads, dys)


@pytest.mark.parametrize(("op", "layout"), [("rms_norm_dense", "data"),
                                            ("rms_norm_dense", "column"),
                                            ("rms_norm", "data")])
def test_kernel_path_inside_shard_map_types_check(op, layout):
    """The Mosaic kernel (interpreted) inside shard_map, forward and backward, type-checks
    with check_vma=True: a Pallas call returns unvarying types, `vary_like` restores them.
    Traced only: the interpreter's ordered callbacks cannot run in a multi-device program."""
    inputs = make_inputs(op, dtype=ml_dtypes.bfloat16, kind="normal", m=16, k=64, n=256)
    in_specs, out_spec, axis_name = specs(op, layout)
    diff = _differentiable(inputs)
    diff_specs = _spec_tree(diff, in_specs)
    shapes = jax.eval_shape(lambda a: CALLS[op](a, eps=EPS, impl="xla"), diff)
    out_specs = jax.tree.map(lambda _: out_spec, shapes)

    def local(a, dy):
        out, vjp = jax.vjp(lambda p: CALLS[op](p, eps=EPS, impl="interpret"), a)
        return out, vjp(dy)[0]

    fn = jax.jit(jax.shard_map(local, mesh=mesh(), in_specs=(diff_specs, out_specs),
                               out_specs=(out_specs, diff_specs)))
    dys = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), shapes)
    text = str(fn.trace(place(diff, diff_specs), place(dys, out_specs)).jaxpr)
    assert "Ref<gmem>{bf16[8,64]" in text  # the kernel on this shard's 8 of the 16 rows


def test_axis_name_errors():
    x = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
    with pytest.raises(ValueError, match="axis_name='model' is not an axis"):
        jaxnorm.rms_norm(x, axis_name="model")

    def inside(fn, spec=P("data", "model")):
        return jax.jit(jax.shard_map(fn, mesh=mesh(), in_specs=spec, out_specs=spec))(
            place(x, spec))

    with pytest.raises(ValueError, match="axis_name='heads' is not an axis"):
        inside(lambda a: jaxnorm.rms_norm(a, axis_name="heads"))
    with pytest.raises(ValueError, match="axis_name must be a mesh axis name"):
        inside(lambda a: jaxnorm.rms_norm(a, axis_name=3))
    with pytest.raises(ValueError, match="x must be sharded over it"):
        inside(lambda a: jaxnorm.layer_norm(a, axis_name="model"), P("data", None))


@pytest.mark.parametrize("op", ["dense_rms_norm", "dense_layer_norm"])
def test_residual_after_column_parallel_matches_unsharded(op):
    """r + Norm(x @ W + b) with the output's N split: values and gradients (dr = dy) of the
    shards against the unsharded reference."""
    inputs = make_inputs(op)
    inputs["residual_after"] = inputs.pop("residual")
    in_specs, out_spec, axis_name = specs(op, "column")
    in_specs = {**in_specs, "residual_after": in_specs["residual"]}
    diff = _differentiable(inputs)
    diff_specs = _spec_tree(diff, in_specs)

    def call(a):
        vectors = [a["bias"], a["scale"]] + ([a["norm_bias"]] if op == "dense_layer_norm" else [])
        return getattr(jaxnorm, op)(a["x"], a["kernel"], *vectors, eps=EPS,
                                    residual_after=a["residual_after"], impl="xla",
                                    axis_name=axis_name)

    def local(a, dy):
        out, vjp = jax.vjp(call, a)
        return out, vjp(dy)[0]

    dy = jnp.asarray(np.random.default_rng(1).standard_normal((M, N)), jnp.float32)
    fn = jax.jit(jax.shard_map(local, mesh=mesh(), in_specs=(diff_specs, out_spec),
                               out_specs=(out_spec, diff_specs)))
    out, grads = fn(place(diff, diff_specs), place(dy, out_spec))
    assert_matches_reference(op, inputs, out, grads, [dy])
