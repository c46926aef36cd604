"""Training `jaxnorm.models` sharded over every device: data parallel and tensor parallel.

One jitted optimizer step (AdamW, next-token loss) with the parameters and the
token batch placed by `jax.sharding.NamedSharding` on a ("data", "model") mesh:

- data: the batch split over all devices, every parameter replicated; XLA sums
  the gradients over the batch shards.
- tensor (Megatron): heads and d_ff split over "model". q/k/v and gate/up are
  column-parallel (kernels split on N: the fused norm + GEMM runs on each
  device's columns with no collective), o and down row-parallel (kernels split
  on K, their outputs all-reduced), the rest replicated; the batch split over
  "data" with the remaining devices.

The mesh's axes are Auto: XLA's partitioner places the rest of the model and,
on the GPU, jaxnorm's partitioning rule splits its kernels per device
(docs/sharding.md). Any device count; on CPU try

    XLA_FLAGS=--xla_force_host_platform_device_count=8 PYTHONPATH=. \\
        python examples/train_sharded.py --layout tensor --tp 4 --steps 5
"""

from __future__ import annotations

import argparse
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxnorm import models

LAYOUTS = ("data", "tensor")
COLUMN_PARALLEL = ("q", "k", "v", "gate", "up")  # kernels [d_model, N]: N over "model"
ROW_PARALLEL = ("o", "down")  # kernels [N, d_model]: K over "model"


def make_mesh(layout: str, tp: int = 1, devices: list | None = None) -> jax.sharding.Mesh:
    """("data", "model") over `devices` (all of them by default): tp per model group."""
    devices = devices or jax.devices()
    tp = 1 if layout == "data" else tp
    if len(devices) % tp:
        raise ValueError(f"tp={tp} must divide the device count {len(devices)}")
    return jax.make_mesh((len(devices) // tp, tp), ("data", "model"),
                         axis_types=(AxisType.Auto, AxisType.Auto), devices=devices)


def param_spec(path: tuple, layout: str) -> P:
    """The PartitionSpec of one parameter, from its path in the model's tree."""
    names = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
    names = names[:-1] if names[-1] == "value" else names  # a Variable's own attribute
    if layout == "tensor" and len(names) >= 2 and names[-1] == "kernel":
        if names[-2] in COLUMN_PARALLEL:
            return P(None, "model")
        if names[-2] in ROW_PARALLEL:
            return P("model", None)
    return P()


def check_divisible(cfg: models.ModelConfig, mesh: jax.sharding.Mesh, batch: int) -> None:
    tp, dp = mesh.shape["model"], mesh.shape["data"]
    for name, size in (("n_heads", cfg.n_heads), ("n_kv_heads", cfg.n_kv_heads),
                       ("d_ff", cfg.d_ff)):
        if size % tp:
            raise ValueError(f"{name}={size} must be a multiple of the model axis ({tp})")
    if batch % dp:
        raise ValueError(f"batch={batch} must be a multiple of the data axis ({dp})")


def sharded_train_step(cfg: models.ModelConfig, mesh: jax.sharding.Mesh, layout: str, *,
                       batch: int, seq_len: int, learning_rate: float = 1e-3, seed: int = 0
                       ) -> tuple[Any, tuple]:
    """(step, (params, opt_state, tokens)): step(*state) -> (loss, params, opt_state), jitted
    with the parameters, optimizer state and tokens sharded for `layout`."""
    check_divisible(cfg, mesh, batch)
    graphdef, params = nnx.split(models.Transformer(cfg, rngs=nnx.Rngs(seed)))
    shardings = jax.tree_util.tree_map_with_path(
        lambda path, _: NamedSharding(mesh, param_spec(path, layout)), params)
    params = jax.device_put(params, shardings)
    optimizer = optax.adamw(learning_rate)
    opt_state = jax.jit(optimizer.init)(params)
    tokens = jax.random.randint(jax.random.key(seed + 1), (batch, seq_len + 1), 0,
                                cfg.vocab_size)
    tokens = jax.device_put(tokens, NamedSharding(mesh, P("data", None)))

    def loss_fn(p, toks):
        return models.next_token_loss(nnx.merge(graphdef, p), toks)

    @jax.jit
    def step(p, state, toks):
        loss, grads = jax.value_and_grad(loss_fn)(p, toks)
        updates, state = optimizer.update(grads, state, p)
        p = jax.lax.with_sharding_constraint(optax.apply_updates(p, updates), shardings)
        return loss, p, state

    return step, (params, opt_state, tokens)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=LAYOUTS, default="data")
    parser.add_argument("--tp", type=int, default=2, help="devices per model group (tensor)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--stock", action="store_true", help="stock Flax layers (fused=False)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[float]:
    args = parse_args(argv)
    mesh = make_mesh(args.layout, args.tp)
    cfg = models.llama(n_heads=4, n_kv_heads=4, d_ff=256, fused=not args.stock)
    step, (params, opt_state, tokens) = sharded_train_step(
        cfg, mesh, args.layout, batch=args.batch, seq_len=args.seq_len)
    losses = []
    for i in range(args.steps):
        loss, params, opt_state = step(params, opt_state, tokens)
        losses.append(float(loss))
        print(f"step {i}: loss {losses[-1]:.4f}")
    print(f"mesh {dict(mesh.shape)}, layout {args.layout}, "
          f"q kernel {params['layers'][0]['attn_in']['q']['kernel'].get_value().sharding.spec}")
    if not np.all(np.isfinite(losses)) or not losses[-1] < losses[0]:
        raise SystemExit(f"training did not make progress: {losses}")
    return losses


if __name__ == "__main__":
    main()
