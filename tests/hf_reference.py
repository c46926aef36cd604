"""A float64 numpy forward pass of the transformers decoder families, from config.json and
tensors by their transformers names: the reference the checkpoint loader is judged against.

Written from transformers' modeling code (llama, qwen2, qwen3, gemma, gemma2,
gemma3, olmo2), independently of `jaxnorm.models`: it reads the config dict
itself and names tensors as transformers does. Also the generator of tiny
random checkpoints in that layout.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

GEMMAS = ("gemma", "gemma2", "gemma3_text")
SANDWICH = ("gemma2", "gemma3_text")  # input, post-attention, pre- and post-feedforward norms


def _rope_params(hf: dict, layer_type: str) -> dict:
    """{"rope_theta", "rope_type", ...} for one layer type, 4.x or 5.x config keys."""
    params = hf.get("rope_parameters")
    if params:
        nested = params.get(layer_type) if isinstance(params.get(layer_type), dict) else None
        return nested or params
    if hf["model_type"] == "gemma3_text" and layer_type == "sliding_attention":
        return {"rope_theta": hf.get("rope_local_base_freq", 10_000.0), "rope_type": "default"}
    scaling = dict(hf.get("rope_scaling") or {})
    scaling.setdefault("rope_type", scaling.pop("type", "default"))
    default_theta = 1_000_000.0 if hf["model_type"] == "gemma3_text" else 10_000.0
    return {"rope_theta": hf.get("rope_theta", default_theta), **scaling}


def inverse_frequencies(params: dict, dim: int) -> np.ndarray:
    """transformers' ROPE_INIT_FUNCTIONS for default, linear and llama3, in float64."""
    inv = np.array([1.0 / params["rope_theta"] ** (j / dim) for j in range(0, dim, 2)])
    kind = params.get("rope_type", "default")
    if kind == "linear":
        return inv / params["factor"]
    if kind == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old = params["original_max_position_embeddings"]
        out = []
        for freq in inv:
            wavelen = 2 * math.pi / freq
            if wavelen < old / high:
                out.append(freq)
            elif wavelen > old / low:
                out.append(freq / factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                out.append((1 - smooth) * freq / factor + smooth * freq)
        return np.array(out)
    assert kind == "default", kind
    return inv


def layer_types(hf: dict) -> list[str]:
    n = hf["num_hidden_layers"]
    if hf.get("layer_types"):
        return list(hf["layer_types"])
    if hf["model_type"] == "gemma2":
        return ["sliding_attention" if not i % 2 else "full_attention" for i in range(n)]
    if hf["model_type"] == "gemma3_text":
        pattern = hf.get("sliding_window_pattern", 6)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    return ["full_attention"] * n


def _act(name: str, x: np.ndarray) -> np.ndarray:
    if name in ("silu", "swish"):
        return x / (1 + np.exp(-x))
    if name in ("gelu_pytorch_tanh", "gelu_new"):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    assert name == "gelu", name
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _rotate(x: np.ndarray, positions: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """apply_rotary_pos_emb on x [B, T, H, D]: x cos + rotate_half(x) sin."""
    emb = np.concatenate([positions[:, None] * inv] * 2, axis=-1)[None, :, None, :]
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(emb) + rotated * np.sin(emb)


def forward(hf: dict, tensors: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    """Logits [B, T, vocab] in float64 of the checkpoint (`hf`, `tensors`) on `tokens` [B, T]."""
    mt = hf["model_type"]
    w = {name: np.asarray(t, np.float64) for name, t in tensors.items()}
    d, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    n_kv = hf.get("num_key_value_heads") or n_heads
    dim = hf.get("head_dim") or d // n_heads
    eps = hf.get("rms_norm_eps", 1e-6)
    act = hf.get("hidden_activation") or hf.get("hidden_act", "silu")
    act = "gelu_pytorch_tanh" if mt == "gemma" and act == "gelu" else act

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        return y * (1 + w[name]) if mt in GEMMAS else y * w[name]

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        y = x @ w[f"{name}.weight"].T
        return y + w[f"{name}.bias"] if f"{name}.bias" in w else y

    x = w["model.embed_tokens.weight"][tokens]
    if mt in GEMMAS:
        x = x * math.sqrt(d)
    b, t = tokens.shape
    pos = np.arange(t, dtype=np.float64)
    scale = (hf.get("query_pre_attn_scalar", 256) if mt in SANDWICH else dim) ** -0.5
    cap = hf.get("attn_logit_softcapping", 50.0 if mt == "gemma2" else None)
    for i, kind in enumerate(layer_types(hf)):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        h = x if mt == "olmo2" else norm(x, f"{p}input_layernorm.weight")
        q, k, v = (linear(h, f"{a}{n}_proj") for n in "qkv")
        if mt == "olmo2":  # over the whole projection, before the head reshape
            q, k = norm(q, f"{a}q_norm.weight"), norm(k, f"{a}k_norm.weight")
        q, k, v = (y.reshape(b, t, -1, dim) for y in (q, k, v))
        if mt in ("qwen3", "gemma3_text"):
            q, k = norm(q, f"{a}q_norm.weight"), norm(k, f"{a}k_norm.weight")
        params = _rope_params(hf, kind)
        inv = inverse_frequencies(params, dim)
        q, k = _rotate(q, pos, inv), _rotate(k, pos, inv)
        k, v = (np.repeat(y, n_heads // n_kv, axis=2) for y in (k, v))
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
        if cap is not None:
            scores = np.tanh(scores / cap) * cap
        qi, ki = np.arange(t)[:, None], np.arange(t)[None, :]
        visible = ki <= qi
        if kind == "sliding_attention":
            visible &= ki > qi - hf["sliding_window"]
        scores = np.where(visible, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = linear(np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, -1), f"{a}o_proj")
        if mt in (*SANDWICH, "olmo2"):
            attn = norm(attn, f"{p}post_attention_layernorm.weight")
        x = x + attn
        if mt == "olmo2":
            h = x
        else:
            h = norm(x, f"{p}pre_feedforward_layernorm.weight" if mt in SANDWICH
                     else f"{p}post_attention_layernorm.weight")
        m = p + "mlp."
        out = linear(_act(act, linear(h, f"{m}gate_proj")) * linear(h, f"{m}up_proj"),
                     f"{m}down_proj")
        if mt in (*SANDWICH, "olmo2"):
            out = norm(out, f"{p}post_feedforward_layernorm.weight")
        x = x + out
    x = norm(x, "model.norm.weight")
    logits = x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
    final = hf.get("final_logit_softcapping", 30.0 if mt == "gemma2" else None)
    return logits if final is None else np.tanh(logits / final) * final


def random_tensors(hf: dict, seed: int, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights with the names and [out, in] shapes transformers gives `hf`'s model."""
    rng = np.random.default_rng(seed)
    mt = hf["model_type"]
    d, n_heads, ff = hf["hidden_size"], hf["num_attention_heads"], hf["intermediate_size"]
    n_kv = hf.get("num_key_value_heads") or n_heads
    dim = hf.get("head_dim") or d // n_heads
    qkv_bias = mt == "qwen2" or hf.get("attention_bias", False)
    o_bias = mt != "qwen2" and hf.get("attention_bias", False)
    mlp_bias = hf.get("mlp_bias", False)
    gain = (lambda n: 0.3 * rng.standard_normal(n)) if mt in GEMMAS else (
        lambda n: 1 + 0.3 * rng.standard_normal(n))
    out: dict[str, np.ndarray] = {"model.embed_tokens.weight":
                                  rng.standard_normal((hf["vocab_size"], d))}

    def linear(name: str, n_out: int, n_in: int, bias: bool) -> None:
        out[f"{name}.weight"] = rng.standard_normal((n_out, n_in)) / math.sqrt(n_in)
        if bias:
            out[f"{name}.bias"] = 0.2 * rng.standard_normal(n_out)

    for i in range(hf["num_hidden_layers"]):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        linear(f"{a}q_proj", n_heads * dim, d, qkv_bias)
        linear(f"{a}k_proj", n_kv * dim, d, qkv_bias)
        linear(f"{a}v_proj", n_kv * dim, d, qkv_bias)
        linear(f"{a}o_proj", d, n_heads * dim, o_bias)
        for name in ("gate_proj", "up_proj"):
            linear(f"{p}mlp.{name}", ff, d, mlp_bias)
        linear(f"{p}mlp.down_proj", d, ff, mlp_bias)
        norms = {"llama": ["input", "post_attention"], "qwen2": ["input", "post_attention"],
                 "qwen3": ["input", "post_attention"], "gemma": ["input", "post_attention"],
                 "olmo2": ["post_attention", "post_feedforward"]}.get(
            mt, ["input", "post_attention", "pre_feedforward", "post_feedforward"])
        for name in norms:
            out[f"{p}{name}_layernorm.weight"] = gain(d)
        if mt in ("qwen3", "gemma3_text"):
            out[f"{a}q_norm.weight"], out[f"{a}k_norm.weight"] = gain(dim), gain(dim)
        if mt == "olmo2":
            out[f"{a}q_norm.weight"], out[f"{a}k_norm.weight"] = gain(n_heads * dim), gain(
                n_kv * dim)
    out["model.norm.weight"] = gain(d)
    if not hf.get("tie_word_embeddings", mt in GEMMAS):
        linear("lm_head", hf["vocab_size"], d, False)
    return {name: t.astype(dtype) for name, t in out.items()}


def write_checkpoint(path: Path, hf: dict, tensors: dict[str, np.ndarray],
                     shards: int = 1) -> None:
    """config.json and the tensors as transformers lays them out (sharded with an index)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf, indent=2))
    if shards == 1:
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
        return
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, path / file, metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
