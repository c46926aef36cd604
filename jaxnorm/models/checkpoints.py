"""Load and save model directories as transformers writes them: config.json plus safetensors.

    model = from_pretrained("path/to/Llama-3.2-1B")            # jaxnorm layers
    stock = from_pretrained("path/to/Llama-3.2-1B", fused=False)
    save_pretrained(flashify_model(model), "out/")              # loads back, here or in torch

Tensors are read with the `safetensors` package's numpy API (no torch), from
`model.safetensors` or the shards that `model.safetensors.index.json` names.
A transformers Linear weight is [out, in]; our kernels are [in, out].

A flashified model saves as the network it computes: its folded projections,
and unit gains (1, or 0 under Gemma's 1 + g) on the norms whose gains it folded
away. Loading that directory (here or in transformers) gives the same logits,
and flashifying it again folds nothing new.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxnorm.models.config import ModelConfig
from jaxnorm.models.folded import params_of
from jaxnorm.models.hf_config import (HF_NORM_CONVENTIONS, CheckpointError, from_hf_config,
                                      to_hf_config)
from jaxnorm.models.transformer import Transformer

Path_ = tuple[str, ...]
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some old checkpoints saved
_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(ml_dtypes.bfloat16): "bfloat16",
                np.dtype(np.float16): "float16"}


def _attention_names(cfg: ModelConfig, i: int) -> Iterator[tuple[Path_, str, bool]]:
    pre, attn = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
    for name in ("q", "k", "v"):
        yield ("attn_in", name, "kernel"), f"{attn}{name}_proj.weight", True
        if cfg.qkv_bias:
            yield ("attn_in", name, "bias"), f"{attn}{name}_proj.bias", False
    yield ("attn", "o", "kernel"), f"{attn}o_proj.weight", True
    if cfg.o_bias:
        yield ("attn", "o", "bias"), f"{attn}o_proj.bias", False
    if cfg.qk_norm:
        yield ("attn", "q_norm", "scale"), f"{attn}q_norm.weight", False
        yield ("attn", "k_norm", "scale"), f"{attn}k_norm.weight", False
    if cfg.pre_norms:
        yield ("attn_in", "norm", "scale"), f"{pre}input_layernorm.weight", False
    if cfg.post_norms:  # "post_attention_layernorm" is an output norm here...
        yield ("attn", "o_norm", "scale"), f"{pre}post_attention_layernorm.weight", False


def _mlp_names(cfg: ModelConfig, i: int) -> Iterator[tuple[Path_, str, bool]]:
    pre, mlp = f"model.layers.{i}.", f"model.layers.{i}.mlp."
    for name in ("gate", "up"):
        yield ("mlp_in", name, "kernel"), f"{mlp}{name}_proj.weight", True
        if cfg.mlp_bias:
            yield ("mlp_in", name, "bias"), f"{mlp}{name}_proj.bias", False
    yield ("down", "kernel"), f"{mlp}down_proj.weight", True
    if cfg.mlp_bias:
        yield ("down", "bias"), f"{mlp}down_proj.bias", False
    if cfg.pre_norms:  # ...and the MLP's input norm in Llama, Qwen and Gemma 1
        norm = "pre_feedforward_layernorm" if cfg.post_norms else "post_attention_layernorm"
        yield ("mlp_in", "norm", "scale"), f"{pre}{norm}.weight", False
    if cfg.post_norms:
        yield ("down_norm", "scale"), f"{pre}post_feedforward_layernorm.weight", False


def hf_names(cfg: ModelConfig) -> dict[Path_, tuple[str, bool]]:
    """Our parameter path -> (transformers tensor name, stored transposed) for the unfolded
    model of `cfg`."""
    names: dict[Path_, tuple[str, bool]] = {("embed", "embedding"): ("model.embed_tokens.weight",
                                                                      False)}
    for i in range(cfg.n_layers):
        for path, name, transposed in (*_attention_names(cfg, i), *_mlp_names(cfg, i)):
            names[("layers", str(i), *path)] = (name, transposed)
    if cfg.tied_embeddings:
        names[("head_norm", "scale")] = ("model.norm.weight", False)
    else:
        names[("head", "norm", "scale")] = ("model.norm.weight", False)
        names[("head", "lm_head", "kernel")] = ("lm_head.weight", True)
    return names


def _flat(tree: dict, prefix: Path_ = ()) -> dict[Path_, object]:
    out = {}
    for key, value in tree.items():
        path = (*prefix, str(key))
        out.update(_flat(value, path) if isinstance(value, dict) else {path: value})
    return out


def _nested(flat: dict[Path_, object], like: dict) -> dict:
    """`flat` in the structure (and key types: nnx.List uses ints) of the pure dict `like`."""
    def walk(node: dict, prefix: Path_) -> dict:
        return {k: walk(v, (*prefix, str(k))) if isinstance(v, dict) else flat[(*prefix, str(k))]
                for k, v in node.items()}
    return walk(like, ())


def _tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: path / file for name, file in weight_map.items()}
    single = path / "model.safetensors"
    if not single.exists():
        raise CheckpointError(f"{path}: neither model.safetensors nor "
                              "model.safetensors.index.json")
    with safe_open(single, framework="numpy") as f:
        return {name: single for name in f.keys()}


def _read(files: dict[str, Path], names: list[str]) -> dict[str, np.ndarray]:
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    out = {}
    for file, wanted in by_file.items():
        with safe_open(file, framework="numpy") as f:
            out.update({name: f.get_tensor(name) for name in wanted})
    return out


def _abstract(cfg: ModelConfig) -> tuple[Transformer, nnx.State, dict]:
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    state = nnx.state(model, nnx.Param)
    return model, state, nnx.to_pure_dict(state)


def from_pretrained(path: str | Path, *, fused: bool = True, impl: str | None = None,
                    dtype=None, param_dtype=None, norm_convention: str = "flax") -> Transformer:
    """The model stored in a transformers directory (config.json + safetensors).

    `fused=False` builds the same network on stock Flax layers. `param_dtype`
    (default: the stored embedding's dtype) is what the tensors are cast to, so
    a bf16 checkpoint loads into float32 parameters with param_dtype=jnp.float32;
    `dtype` is the computation dtype (None: Flax promotion). `norm_convention`
    ("flax", "hf_llama", "gemma", or "hf": the family's transformers rounding,
    `HF_NORM_CONVENTIONS`) is `ModelConfig.norm_convention`. Raises
    `CheckpointError` for an unknown model_type, an option not implemented, a
    missing, unexpected or misshapen tensor.
    """
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.exists():
        raise CheckpointError(f"{path}: no config.json")
    hf_cfg = json.loads(config_file.read_text())
    cfg = from_hf_config(hf_cfg)
    if norm_convention == "hf":
        norm_convention = HF_NORM_CONVENTIONS[hf_cfg["model_type"]]
    cfg = cfg.replace(norm_convention=norm_convention)  # checked before any tensor is read
    files = _tensor_files(path)
    names = hf_names(cfg)
    missing = sorted(name for name, _ in names.values() if name not in files)
    if missing:
        raise CheckpointError(f"{path}: missing tensors for {hf_cfg['model_type']}: {missing}")
    expected = {name for name, _ in names.values()}
    if cfg.tied_embeddings:
        expected.add("lm_head.weight")  # some tied checkpoints store the shared table twice
    unexpected = sorted(n for n in files if n not in expected and not n.endswith(_IGNORED_SUFFIXES))
    if unexpected:
        raise CheckpointError(f"{path}: tensors this {hf_cfg['model_type']} config does not "
                              f"use (an option not implemented?): {unexpected}")
    tensors = _read(files, [name for name, _ in names.values()])
    if param_dtype is None:
        param_dtype = tensors["model.embed_tokens.weight"].dtype
    cfg = cfg.replace(fused=fused, impl=impl, dtype=dtype, param_dtype=jnp.dtype(param_dtype))
    model, state, shapes = _abstract(cfg)
    flat_shapes = _flat(shapes)
    values = {}
    for our, (name, transposed) in names.items():
        array = tensors[name].T if transposed else tensors[name]
        want = tuple(flat_shapes[our].shape)
        if array.shape != want:
            raise CheckpointError(f"{path}: tensor {name} has shape {tensors[name].shape}; "
                                  f"the config implies {want[::-1] if transposed else want}")
        values[our] = jnp.asarray(array).astype(cfg.param_dtype)  # cast where it lives
    nnx.replace_by_pure_dict(state, _nested(values, shapes))
    nnx.update(model, state)
    return model


def _unit_gain(cfg: ModelConfig, shape: tuple[int, ...], dtype) -> np.ndarray:
    """The stored weight of a norm whose gain was folded away: a gain of exactly 1."""
    return np.full(shape, 0.0 if cfg.norm_offset else 1.0, dtype)


def save_pretrained(model: Transformer, path: str | Path) -> None:
    """Write `model` as transformers does (config.json, model.safetensors, HF tensor names).

    A flashified model saves as the network it computes (see the module
    docstring); a config no transformers family expresses raises `CheckpointError`.
    """
    cfg = model.cfg
    unfolded = cfg.replace(folded=False)
    params = {k: np.asarray(v) for k, v in _flat(params_of(model)).items()}
    dtype = np.dtype(jnp.dtype(cfg.param_dtype))
    if dtype not in _DTYPE_NAMES:
        raise CheckpointError(f"param_dtype {dtype} has no transformers name; use float32, "
                              "bfloat16 or float16")
    hf_cfg = to_hf_config(unfolded, _DTYPE_NAMES[dtype])
    shapes = _flat(_abstract(unfolded)[2])
    tensors = {}
    for our, (name, transposed) in hf_names(unfolded).items():
        if our in params:
            array = params.pop(our)
        elif cfg.folded and our[-2:] == ("norm", "scale"):
            array = _unit_gain(cfg, tuple(shapes[our].shape), dtype)
        else:
            raise CheckpointError(f"model has no parameter {'/'.join(our)} for {name}")
        tensors[name] = np.ascontiguousarray(array.T if transposed else array)
    if params:
        raise CheckpointError(f"parameters with no transformers name: {sorted(params)}")
    path = Path(path)
    if (path / "model.safetensors.index.json").exists():
        raise CheckpointError(f"{path} holds a sharded checkpoint whose index would shadow "
                              "the model.safetensors written here; save to an empty directory")
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")


__all__ = ["CheckpointError", "from_pretrained", "hf_names", "save_pretrained"]
