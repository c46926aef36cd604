"""config.json of a transformers checkpoint <-> `ModelConfig`, for the families we implement.

Reads what transformers 4.x writes (`rope_theta`, `rope_scaling`, Gemma 3's
`rope_local_base_freq`) and what 5.x writes (`rope_parameters`, nested per layer
type for Gemma 3). An option that changes the network and is not implemented
raises `CheckpointError` naming it; options that do not change the forward pass
(token ids, dropout, cache settings, `max_position_embeddings`) are not read.
"""

from __future__ import annotations

from typing import Any

from jaxnorm.models.config import ModelConfig, RopeScaling

FAMILIES = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "olmo2")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM",
                 "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                 "olmo2": "Olmo2ForCausalLM"}
_GEMMAS = ("gemma", "gemma2", "gemma3_text")
_SLIDING = ("gemma2", "gemma3_text")
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_new": "gelu_tanh", "gelu": "gelu"}
_DEFAULT_THETA = {"gemma3_text": 1_000_000.0}
# How each family's RMSNorm rounds in transformers (`jaxnorm.conventions`): Llama's and the
# Qwens' cast to the input dtype before the gain; Gemma's and OLMo 2's after it.
HF_NORM_CONVENTIONS = {"llama": "hf_llama", "qwen2": "hf_llama", "qwen3": "hf_llama",
                       "gemma": "gemma", "gemma2": "gemma", "gemma3_text": "gemma",
                       "olmo2": "gemma"}


class CheckpointError(ValueError):
    """A checkpoint directory this loader cannot read as the network it describes."""


def _unsupported(model_type: str, option: str, value: Any) -> CheckpointError:
    return CheckpointError(f"{model_type}: config option {option}={value!r} is not implemented")


def _rope_block(hf: dict, model_type: str, layer_type: str) -> tuple[float, dict]:
    """(theta, scaling dict) for one layer type, from either config generation."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and params:
        if all(isinstance(v, dict) for v in params.values()):  # nested per layer type (5.x)
            if layer_type not in params:
                raise CheckpointError(f"{model_type}: rope_parameters has no {layer_type!r} "
                                      f"entry; got {sorted(params)}")
            params = params[layer_type]
        return float(params["rope_theta"]), params
    if model_type == "gemma3_text" and layer_type == "sliding_attention":
        return float(hf.get("rope_local_base_freq", 10_000.0)), {}
    theta = float(hf.get("rope_theta", _DEFAULT_THETA.get(model_type, 10_000.0)))
    return theta, hf.get("rope_scaling") or {}


def _scaling(block: dict, model_type: str) -> RopeScaling | None:
    kind = block.get("rope_type", block.get("type", "default"))
    if kind == "default":
        return None
    if kind == "linear":
        return RopeScaling("linear", float(block["factor"]))
    if kind == "llama3":
        return RopeScaling("llama3", float(block["factor"]), float(block["low_freq_factor"]),
                           float(block["high_freq_factor"]),
                           int(block["original_max_position_embeddings"]))
    raise _unsupported(model_type, "rope type", kind)


def _layer_types(hf: dict, model_type: str, n_layers: int) -> tuple[str, ...]:
    types = hf.get("layer_types")
    if types is None and model_type == "gemma2":
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
    if types is None and model_type == "gemma3_text":
        pattern = int(hf.get("sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                 for i in range(n_layers)]
    if types is None:
        return ()
    names = {"full_attention": "full", "sliding_attention": "sliding"}
    if len(types) != n_layers or not set(types) <= set(names):
        raise _unsupported(model_type, "layer_types", types)
    if "sliding_attention" in types and model_type not in _SLIDING:
        raise _unsupported(model_type, "sliding layers (layer_types)", types)
    out = tuple(names[t] for t in types)
    return out if "sliding" in out else ()


def _activation(hf: dict, model_type: str) -> str:
    name = hf.get("hidden_activation") or hf.get("hidden_act", "silu")
    if model_type == "gemma" and name == "gelu":  # Gemma 1's "gelu" is the tanh approximation
        return "gelu_tanh"
    if name not in _ACTIVATIONS:
        raise _unsupported(model_type, "hidden_act", name)
    return _ACTIVATIONS[name]


def _check_unsupported(hf: dict, model_type: str) -> None:
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise _unsupported(model_type, "partial_rotary_factor", hf["partial_rotary_factor"])
    if model_type in ("qwen2", "qwen3") and hf.get("use_sliding_window"):
        raise _unsupported(model_type, "use_sliding_window", True)
    if hf.get("use_bidirectional_attention"):
        raise _unsupported(model_type, "use_bidirectional_attention", True)
    if model_type != "llama" and hf.get("mlp_bias"):
        raise _unsupported(model_type, "mlp_bias", True)


def _optional_float(hf: dict, key: str, model_type: str) -> float | None:
    """A soft-cap: Gemma 2's defaults (50 on scores, 30 on logits) when absent, none for 3."""
    default = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}[key]
    value = hf.get(key, default if model_type == "gemma2" else None)
    return None if value is None else float(value)


def from_hf_config(hf: dict) -> ModelConfig:
    """The `ModelConfig` of a transformers config.json (as a dict); see the module docstring."""
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(f"unknown model_type {model_type!r}; implemented: {FAMILIES}")
    _check_unsupported(hf, model_type)
    d, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    n_layers = int(hf["num_hidden_layers"])
    layer_types = _layer_types(hf, model_type, n_layers)
    theta, full = _rope_block(hf, model_type, "full_attention")
    if model_type == "gemma2" and _scaling(full, model_type) is not None:
        raise _unsupported(model_type, "rope scaling", full)  # one rope for both layer types
    fields: dict[str, Any] = dict(
        vocab_size=int(hf["vocab_size"]), d_model=d, n_layers=n_layers, n_heads=heads,
        n_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or d // heads), d_ff=int(hf["intermediate_size"]),
        rope_theta=theta, rope_scaling=_scaling(full, model_type),
        eps=float(hf.get("rms_norm_eps", 1e-6)), activation=_activation(hf, model_type),
        tied_embeddings=bool(hf.get("tie_word_embeddings", model_type in _GEMMAS)),
        layer_types=layer_types)
    bias = bool(hf.get("attention_bias", False))
    fields.update(qkv_bias=bias, o_bias=bias)
    if model_type == "llama":
        fields.update(mlp_bias=bool(hf.get("mlp_bias", False)))
    if model_type == "qwen2":
        fields.update(qkv_bias=True, o_bias=False)
    if model_type in ("qwen3", "gemma3_text", "olmo2"):
        fields.update(qk_norm=True)
    if model_type == "olmo2":
        fields.update(pre_norms=False, post_norms=True, qk_norm_over="projection")
    if model_type in _GEMMAS:
        fields.update(norm_offset=1.0, embed_scale=True)
    if model_type in _SLIDING:
        fields.update(post_norms=True,
                      query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
                      attn_softcap=_optional_float(hf, "attn_logit_softcapping", model_type),
                      final_softcap=_optional_float(hf, "final_logit_softcapping", model_type),
                      sliding_window=int(hf.get("sliding_window") or 4096))
    if model_type == "gemma3_text":
        local_theta, local = _rope_block(hf, model_type, "sliding_attention")
        if _scaling(local, model_type) is not None:
            raise _unsupported(model_type, "rope scaling on sliding layers", local)
        fields.update(local_rope_theta=local_theta)
    return ModelConfig(**fields)


def model_type_of(cfg: ModelConfig) -> str:
    """The transformers family whose architecture `cfg` is (checked by `to_hf_config`)."""
    if cfg.post_norms:
        if not cfg.pre_norms:
            return "olmo2"
        return "gemma3_text" if cfg.qk_norm else "gemma2"
    if cfg.norm_offset:
        return "gemma"
    if cfg.qk_norm:
        return "qwen3"
    return "qwen2" if cfg.qkv_bias and not cfg.o_bias else "llama"


_ARCHITECTURE_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                        "d_ff", "rope_theta", "rope_scaling", "eps", "pre_norms", "post_norms",
                        "norm_offset", "qk_norm", "qk_norm_over", "qkv_bias", "o_bias",
                        "mlp_bias", "activation", "embed_scale", "tied_embeddings",
                        "query_pre_attn_scalar", "attn_softcap", "final_softcap",
                        "sliding_window", "layer_types", "local_rope_theta")


def _normalized(cfg: ModelConfig) -> tuple:
    """The architecture fields, with the defaults that mean the same network made explicit."""
    values = {f: getattr(cfg, f) for f in _ARCHITECTURE_FIELDS}
    if not cfg.qk_norm:
        values["qk_norm_over"] = "head"
    if values["query_pre_attn_scalar"] == cfg.head_dim:
        values["query_pre_attn_scalar"] = None
    if not cfg.layer_types:
        values["sliding_window"] = values["local_rope_theta"] = None
    if values["local_rope_theta"] == cfg.rope_theta and cfg.rope_scaling is None:
        values["local_rope_theta"] = None
    return tuple(values.values())


def _rope_scaling_json(scaling: RopeScaling | None) -> dict | None:
    if scaling is None:
        return None
    if scaling.kind == "linear":
        return {"rope_type": "linear", "factor": scaling.factor}
    return {"rope_type": "llama3", "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position}


def to_hf_config(cfg: ModelConfig, dtype_name: str) -> dict:
    """config.json (transformers 4.x keys) for `cfg`; raises if no family expresses it."""
    model_type = model_type_of(cfg)
    hf: dict[str, Any] = {
        "architectures": [ARCHITECTURES[model_type]], "model_type": model_type,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim, "rms_norm_eps": cfg.eps, "rope_theta": cfg.rope_theta,
        "rope_scaling": _rope_scaling_json(cfg.rope_scaling),
        "tie_word_embeddings": cfg.tied_embeddings, "attention_bias": cfg.qkv_bias,
        "max_position_embeddings": 8192, "torch_dtype": dtype_name,
        "hidden_act": {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh",
                       "gelu": "gelu"}[cfg.activation],
    }
    if model_type in _GEMMAS:  # the key Gemma's configs read first
        hf["hidden_activation"] = hf["hidden_act"]
    if model_type == "qwen2":
        del hf["attention_bias"]
    if model_type == "llama":
        hf["mlp_bias"] = cfg.mlp_bias
    if model_type in _SLIDING:
        hf.update(query_pre_attn_scalar=cfg.query_pre_attn_scalar or cfg.head_dim,
                  attn_logit_softcapping=cfg.attn_softcap,
                  final_logit_softcapping=cfg.final_softcap,
                  sliding_window=cfg.sliding_window or 4096,
                  layer_types=[f"{t}_attention" for t in cfg.layer_types or
                               ("full",) * cfg.n_layers])
    if model_type == "gemma3_text":
        hf["rope_local_base_freq"] = cfg.local_rope_theta or cfg.rope_theta
    if _normalized(from_hf_config(hf)) != _normalized(cfg):
        raise CheckpointError(f"this ModelConfig is no {model_type} architecture that "
                              f"transformers can load (nearest family: {model_type})")
    return hf
