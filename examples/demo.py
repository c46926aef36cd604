"""jaxnorm end to end: the same transformer on stock Flax layers and on jaxnorm's fused layers.

On whatever device JAX finds, this builds a small Llama-style model twice (one
switch: `fused`), shows equal logits, trains both on a synthetic task
(continue an arithmetic progression mod the vocabulary) with matching loss
curves (printed, and plotted to <out>/loss_curves.png), folds the trained
norms into the projections (FlashNorm "flashify"), and greedy-decodes with the
stock, jaxnorm and flashified models: the same tokens.

    .venv/bin/python examples/demo.py               # a few hundred steps, ~1 minute on CPU
    .venv/bin/python examples/demo.py --quick       # a smoke run for tests
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

import jaxnorm
from jaxnorm import dispatch, models

STYLES = {"llama": models.llama, "qwen3": models.qwen3, "gemma": models.gemma}
# Float32 end to end: two float32 computations of one network agree to a few
# ulps per layer; these bounds leave room for that and nothing more.
LOGITS_RTOL = 1e-4
LOSS_RTOL = 1e-3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per model")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (30 steps)")
    parser.add_argument("--style", choices=sorted(STYLES), default="llama",
                        help="model style: llama (untied), qwen3 (QK-norm), gemma (1 + g)")
    parser.add_argument("--out", type=Path, default=Path("demo_out"), help="where the plot goes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = min(args.steps, 30)
    return args


def progressions(rng: np.random.Generator, batch: int, length: int, vocab: int) -> jax.Array:
    """Rows a, a + s, a + 2s, ... mod vocab, with s in 1..3: learnable only by attending back."""
    start = rng.integers(0, vocab, (batch, 1))
    step = rng.integers(1, 4, (batch, 1))
    return jnp.asarray((start + step * np.arange(length)) % vocab, jnp.int32)


def describe_device(console: Console) -> None:
    device = jax.devices()[0]
    console.print(f"[bold]device[/]: {device.platform} ({device.device_kind})")
    if dispatch.hopper_or_newer():
        console.print("[bold]implementation[/]: Mosaic GPU kernels where the shape is supported")
    else:
        console.print("[bold]implementation[/]: xla (pure JAX; Mosaic kernels need a Hopper GPU)")


def relative_difference(a: jax.Array, b: jax.Array) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), np.finfo(np.float32).tiny))


def check(console: Console, ok: bool, what: str) -> bool:
    console.print(f"  {'[green]✓' if ok else '[red]✗'}[/] {what}")
    return ok


def train(console: Console, pair: dict[str, models.Transformer], steps: int, seed: int,
          vocab: int) -> dict[str, list[float]]:
    """Train every model on the same batches; returns each one's loss per step."""
    optimizers = {name: nnx.Optimizer(m, optax.adamw(3e-3), wrt=nnx.Param)
                  for name, m in pair.items()}
    losses: dict[str, list[float]] = {name: [] for name in pair}
    rng = np.random.default_rng(seed)
    report_every = max(steps // 10, 1)
    table = Table("step", *(f"loss ({name})" for name in pair), "|Δ| / loss")
    columns = (TextColumn("training"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[loss]}"))
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("train", total=steps, loss="")
        for step in range(steps):
            batch = progressions(rng, 32, 25, vocab)
            for name, model in pair.items():
                losses[name].append(float(models.train_step(model, optimizers[name], batch)))
            now = [losses[name][-1] for name in pair]
            progress.update(task, advance=1, loss=f"loss {now[0]:.4f}")
            if step % report_every == 0 or step == steps - 1:
                spread = (max(now) - min(now)) / max(abs(now[0]), 1e-30)
                table.add_row(str(step), *(f"{v:.6f}" for v in now), f"{spread:.1e}")
    console.print(table)
    return losses


def plot(losses: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(losses)
    curves = np.asarray([losses[n] for n in names])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for name, curve, style in zip(names, curves, ("-", "--")):
        top.plot(curve, style, label=name)
    top.set_yscale("log")
    top.set_ylabel("next-token loss")
    top.legend()
    top.set_title("stock Flax layers vs jaxnorm fused layers")
    bottom.semilogy(np.abs(curves[0] - curves[1]) / np.abs(curves[1]), ".", markersize=3)
    bottom.set_ylabel("|Δ loss| / loss")
    bottom.set_title("steps with bit-identical losses have no point", fontsize=9)
    bottom.set_xlabel("step")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def kernel_path(console: Console, model: models.Transformer, prompts: jax.Array) -> bool:
    """The trained model in bfloat16 through the Mosaic kernels vs xla.

    Forced with impl="mosaic": at this model's decode sizes automatic dispatch
    prefers xla (measured faster there), and this section is about the kernels.
    """
    if not dispatch.hopper_or_newer():
        console.print("  skipped: no Hopper GPU here. The same kernels run on CPU under the "
                      "Pallas interpreter: examples/decode_parity.py --impl interpret --steps 3")
        return True
    kernels = models.load_params(model, dtype=jnp.bfloat16, impl="mosaic")
    xla = models.load_params(model, dtype=jnp.bfloat16, impl="xla")
    kernel_tokens = np.asarray(models.greedy_decode(kernels, prompts, 8))
    xla_tokens = np.asarray(models.greedy_decode(xla, prompts, 8))
    console.print(f"  greedy tokens (kernels): {kernel_tokens.tolist()}")
    return check(console, np.array_equal(kernel_tokens, xla_tokens),
                 "identical tokens with the kernels and with xla (bfloat16)")


def main(argv: list[str] | None = None) -> int:
    # Both variants compute float32 products in float32 on every device (GPUs
    # default to TF32 for the stock layers), so "equal" means float32-equal.
    with jax.default_matmul_precision("highest"):
        return run(parse_args(argv))


def run(args: argparse.Namespace) -> int:
    console = Console()
    started = time.perf_counter()
    describe_device(console)
    # Every projection width a multiple of 64, so on a Hopper GPU the kernels serve them all.
    cfg = STYLES[args.style](vocab_size=64, d_model=64, n_layers=2, head_dim=32, d_ff=128)
    ok = True

    console.rule("1. one network, two sets of layers")
    jaxnorm_model = models.Transformer(cfg.replace(fused=True), rngs=nnx.Rngs(args.seed))
    stock_model = models.Transformer(cfg.replace(fused=False), rngs=nnx.Rngs(args.seed))
    same_tree = (jax.tree.structure(models.params_of(jaxnorm_model))
                 == jax.tree.structure(models.params_of(stock_model)))
    ok &= check(console, same_tree, "same parameter names and shapes from the same Rngs")
    tokens = progressions(np.random.default_rng(args.seed + 1), 4, 16, cfg.vocab_size)
    diff = relative_difference(jaxnorm_model(tokens)[0], stock_model(tokens)[0])
    ok &= check(console, diff <= LOGITS_RTOL, f"equal logits (max |Δ| / max |logit| = {diff:.1e})")

    console.rule(f"2. training both for {args.steps} steps")
    losses = train(console, {"stock": stock_model, "jaxnorm": jaxnorm_model}, args.steps,
                   args.seed, cfg.vocab_size)
    spread = max(abs(a - b) / abs(b) for a, b in zip(losses["jaxnorm"], losses["stock"]))
    ok &= check(console, spread <= LOSS_RTOL, f"matching loss curves (worst |Δ| / loss = "
                                              f"{spread:.1e})")
    plot_path = args.out / "loss_curves.png"
    plot(losses, plot_path)
    console.print(f"  loss curves: {plot_path}")

    console.rule("3. flashify: norm gains folded into the projections")
    folded = models.flashify_model(jaxnorm_model)
    removed = len(jax.tree.leaves(models.params_of(jaxnorm_model))) - len(
        jax.tree.leaves(models.params_of(folded)))
    diff = relative_difference(folded(tokens)[0], jaxnorm_model(tokens)[0])
    ok &= check(console, diff <= LOGITS_RTOL,
                f"{removed} gain vectors folded; same logits (max |Δ| / max |logit| = {diff:.1e})")

    console.rule("4. greedy decoding with a KV cache")
    prompts = progressions(np.random.default_rng(args.seed + 2), 3, 3, cfg.vocab_size)
    decoded = {name: np.asarray(models.greedy_decode(m, prompts, 8)) for name, m in
               (("stock", stock_model), ("jaxnorm", jaxnorm_model), ("flashified", folded))}
    table = Table("prompt", *decoded)
    for i, prompt in enumerate(np.asarray(prompts)):
        table.add_row(" ".join(map(str, prompt)), *(" ".join(map(str, d[i]))
                                                    for d in decoded.values()))
    console.print(table)
    ok &= check(console, all(np.array_equal(d, decoded["stock"]) for d in decoded.values()),
                "identical tokens")

    console.rule("5. the kernel path: bfloat16, impl='mosaic'")
    ok &= kernel_path(console, jaxnorm_model, prompts)

    reasons = jaxnorm.fallback_reasons()
    console.print(f"[bold]fallbacks to xla[/]: {reasons or 'none recorded'}")
    console.print(f"done in {time.perf_counter() - started:.0f} s: "
                  f"{'[green]all checks passed' if ok else '[red]some checks failed'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
