"""transformers vs `jaxnorm.models.from_pretrained` on tiny random checkpoints of every family.

    PYTHONPATH=. python bench/gpu/hf_parity.py            # writes $OUT/hf_parity.md

Needs torch and transformers (no network: configs are built in code). For each
family it builds a tiny random model with transformers (float32, eager
attention, on the CPU), randomizes every weight (transformers initializes norms
to unit gain and biases to zero, which would hide their mapping), saves it with
`save_pretrained`, loads the directory with jaxnorm (stock layers, jaxnorm
layers, flashified; on the GPU) and compares float32 logits (max abs error,
and relative to the largest logit) and 24 greedy tokens (transformers' by full
recomputation each step, jaxnorm's with its KV cache). A family this
transformers lacks is skipped and the table says so. The weights are the numpy
draw of `tests/hf_reference.random_tensors` (seeded), so $OUT/hf_golden.json
(config.json, seed, prompt, transformers' logits and tokens; commit it as
tests/data/hf_golden.json) lets the CPU tests rebuild each checkpoint and hold
the loader to transformers' own numbers.

Then the post-sublayer norm at Gemma-2-9B's width (d = 3584): Norm(a @ W_o) and
Norm(h @ W_down) with (1 + g) gains through `jaxnorm.dense_rms_norm` (automatic
dispatch), against float64 and timed against the stock composition.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxnorm  # noqa: E402
from jaxnorm import models  # noqa: E402
from verify import references as ref  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from hf_reference import random_tensors  # noqa: E402

STEPS, PROMPT = 24, 6
SEEDS = {"llama": 11, "qwen2": 12, "qwen3": 13, "gemma": 14, "gemma2": 15, "gemma3_text": 16,
         "olmo2": 17}
BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
            max_position_embeddings=128)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
# family: (config class, causal-LM class, config arguments)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
                   rope_theta=10_000.0, rope_scaling=LLAMA3_ROPE)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(tie_word_embeddings=True, rope_theta=1_000_000.0)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(tie_word_embeddings=False, rope_theta=1_000.0)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM",
              dict(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                   rope_theta=1_000.0)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
                    attn_logit_softcapping=5.0, final_logit_softcapping=15.0, sliding_window=4,
                    rope_theta=1_000.0)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    dict(hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=16,
                         sliding_window=4, sliding_window_pattern=2, rope_theta=1_000_000.0,
                         rope_local_base_freq=100.0,
                         rope_scaling={"rope_type": "linear", "factor": 4.0})),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM",
              dict(tie_word_embeddings=False, rope_theta=500_000.0)),
}


def randomize(model, torch, path: Path, seed: int) -> dict:
    """Load the weights `tests/hf_reference.random_tensors` draws for the saved config.json
    into `model` (transformers initializes norms to unit gain and biases to zero, which
    would hide their mapping); the same numpy draw rebuilds them where torch is absent.
    Returns that config."""
    config = json.loads((path / "config.json").read_text())
    tensors = random_tensors(config, seed)
    missing, unexpected = model.load_state_dict(
        {name: torch.from_numpy(t) for name, t in tensors.items()}, strict=False)
    allowed = {"lm_head.weight"} if "lm_head.weight" not in tensors else set()
    if unexpected or set(missing) - allowed:
        raise RuntimeError(f"random_tensors does not match the transformers model: missing "
                           f"{sorted(set(missing) - allowed)}, unexpected {sorted(unexpected)}")
    if "lm_head.weight" in missing:  # tied: the head must be the embedding table itself
        model.tie_weights()
    return config


def build(transformers, torch, family: str, path: Path):
    """(random transformers model of `family` saved to `path`, its config.json), or None if
    this transformers has no such classes."""
    config_name, model_name, kwargs = FAMILIES[family]
    config_cls = getattr(transformers, config_name, None)
    model_cls = getattr(transformers, model_name, None)
    if config_cls is None or model_cls is None:
        return None
    config = config_cls(**BASE, **kwargs)
    try:  # eager attention: the path that implements soft-capping in every version
        model = model_cls._from_config(config, attn_implementation="eager")
    except TypeError:
        model = model_cls(config)
    model = model.float().eval()
    model.save_pretrained(path, safe_serialization=True)  # writes the config.json we draw from
    hf_config = randomize(model, torch, path, seed=SEEDS[family])
    model.save_pretrained(path, safe_serialization=True)
    return model, hf_config


def torch_greedy(model, torch, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(logits of the prompt [B, P, V], STEPS greedy tokens [B, STEPS]), recomputing fully."""
    tokens = torch.tensor(prompt, dtype=torch.long)
    with torch.no_grad():
        logits = model(tokens).logits.float().numpy()
        for _ in range(STEPS):
            nxt = model(tokens).logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], dim=1)
    return logits, tokens[:, prompt.shape[1]:].numpy()


def jax_variants(path: Path) -> dict[str, models.Transformer]:
    fused = models.from_pretrained(path, param_dtype=jnp.float32)
    return {"stock": models.from_pretrained(path, fused=False, param_dtype=jnp.float32),
            "jaxnorm": fused, "flashified": models.flashify_model(fused)}


def compare(family: str, want_logits: np.ndarray, want_tokens: np.ndarray, path: Path,
            prompt: np.ndarray) -> list[str]:
    rows = []
    scale = float(np.abs(want_logits).max())
    for name, model in jax_variants(path).items():
        logits = np.asarray(model(jnp.asarray(prompt))[0], np.float32)
        err = float(np.abs(logits.astype(np.float64) - want_logits).max())
        tokens = np.asarray(models.greedy_decode(model, jnp.asarray(prompt), STEPS))
        same = int((tokens == want_tokens).all(axis=1).sum())
        first = np.argwhere(tokens != want_tokens)
        where = "" if first.size == 0 else f" (first diff: row {first[0][0]}, step {first[0][1]})"
        verdict = "PASS" if err <= 1e-4 * scale and same == len(prompt) else "FAIL"
        rows.append(f"| {family} | {name} | {err:.3g} | {err / scale:.3g} | "
                    f"{same}/{len(prompt)}{where} | {verdict} |")
    return rows


def timed(fn, *args, repeats: int = 20) -> float:
    """Median wall time of the jitted fn in microseconds."""
    jitted = jax.jit(fn)
    jax.block_until_ready(jitted(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(jitted(*args))
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def post_norm_rows(m: int = 4096, d: int = 3584, widths: tuple[int, int] = (4096, 14336),
                   repeats: int = 20) -> list[str]:
    """Gemma-2-9B's o_proj (4096 -> d) and down_proj (14336 -> d) with the output norm."""
    rows = []
    rng = np.random.default_rng(0)
    for name, k in zip(("attn out: Norm(a @ W_o)", "mlp out: Norm(h @ W_down)"), widths):
        x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        w = jnp.asarray(rng.standard_normal((k, d)) / np.sqrt(k), jnp.bfloat16)
        g = jnp.asarray(0.3 * rng.standard_normal(d), jnp.float32)

        def fused(x, w, g):
            return jaxnorm.dense_rms_norm(x, w, None, g, eps=1e-6, scale_offset=1.0)

        def stock(x, w, g):
            y = jnp.dot(x, w, preferred_element_type=jnp.float32)
            y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + 1e-6)
            return (y * (1.0 + g)).astype(x.dtype)

        want, _ = ref.dense_rms_norm(np.asarray(x, np.float64), np.asarray(w, np.float64),
                                     None, 1.0 + np.asarray(g, np.float64), eps=1e-6)
        errs = [float(np.abs(np.asarray(jax.jit(f)(x, w, g), np.float64) - want).max())
                for f in (fused, stock)]
        t_fused, t_stock = timed(fused, x, w, g, repeats=repeats), timed(stock, x, w, g,
                                                                         repeats=repeats)
        rows.append(f"| {name} | {m}x{k} @ {k}x{d} | {errs[0]:.3g} | {errs[1]:.3g} | "
                    f"{t_fused:.1f} | {t_stock:.1f} | {t_stock / t_fused:.2f}x |")
    return rows


def main() -> int:
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="hf_parity_"))
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# transformers parity of jaxnorm.models.from_pretrained\n",
             f"device: {jax.devices()[0].device_kind}\n"]
    golden: list[dict] = []
    try:
        import torch
        import transformers
    except ImportError as err:
        lines.append(f"transformers parity skipped: {err}\n")
    else:
        lines += [f"transformers {transformers.__version__}, torch {torch.__version__}; "
                  f"{STEPS} greedy tokens after a {PROMPT}-token prompt; PASS: max error "
                  "<= 1e-4 of the largest logit and every row's tokens identical\n",
                  "| family | jaxnorm model | max abs err | relative | greedy rows equal | |",
                  "|---|---|---|---|---|---|"]
        prompt = np.random.default_rng(7).integers(0, BASE["vocab_size"], (2, PROMPT))
        checkpoints = Path(tempfile.mkdtemp(prefix="hf_parity_checkpoints_"))  # not under $OUT
        for family in FAMILIES:
            path = checkpoints / family
            try:
                built = build(transformers, torch, family, path)
                if built is None:
                    lines.append(f"| {family} | skipped: transformers "
                                 f"{transformers.__version__} lacks it | | | | |")
                    continue
                model, hf_config = built
                want_logits, want_tokens = torch_greedy(model, torch, prompt)
                golden.append({"family": family, "config": hf_config, "seed": SEEDS[family],
                               "prompt": prompt.tolist(), "tokens": want_tokens.tolist(),
                               "logits": [float(f"{v:.8g}") for v in want_logits.ravel()]})
                with jax.default_matmul_precision("highest"):  # float32 products, not TF32
                    lines += compare(family, want_logits.astype(np.float64), want_tokens, path,
                                     prompt)
            except Exception as err:  # one family's failure must not hide the others
                lines.append(f"| {family} | ERROR: {type(err).__name__}: {err} | | | | |")
    lines += ["\n## Post-sublayer norm at Gemma-2-9B width (bf16, (1 + g) gain)\n",
              "| sublayer | shape | jaxnorm max abs err vs float64 | stock's | jaxnorm us | "
              "stock us | speedup |", "|---|---|---|---|---|---|---|", *post_norm_rows(),
              f"\nfallbacks: {jaxnorm.fallback_reasons() or 'none'}"]
    if golden:
        (out / "hf_golden.json").write_text(json.dumps(
            {"transformers": transformers.__version__, "torch": torch.__version__,
             "steps": STEPS, "families": golden}) + "\n")
        lines.append("\ngolden values: hf_golden.json (commit as tests/data/hf_golden.json)")
    text = "\n".join(lines) + "\n"
    (out / "hf_parity.md").write_text(text)
    print(text)
    return 1 if "FAIL" in text or "ERROR" in text else 0


if __name__ == "__main__":
    sys.exit(main())
