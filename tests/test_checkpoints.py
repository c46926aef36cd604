"""from_pretrained / save_pretrained on tiny random checkpoints in the transformers layout,
judged by the float64 reference of each family (tests/hf_reference.py)."""

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from hf_reference import forward, random_tensors, write_checkpoint
from jaxnorm import models

_BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5)

# One config per family, each turning on what distinguishes it (small windows, caps and
# rope contexts, so that 12 tokens feel them); 4.x keys unless the name says v5.
CONFIGS = {
    "llama3": dict(model_type="llama", attention_bias=True, mlp_bias=True,
                   tie_word_embeddings=False, rope_theta=10_000.0,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 64}),
    "llama_linear_v5": dict(model_type="llama", tie_word_embeddings=True,
                            rope_parameters={"rope_type": "linear", "rope_theta": 500.0,
                                             "factor": 3.0}),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True, rope_theta=1_000_000.0,
                  sliding_window=4, use_sliding_window=False),
    "qwen3": dict(model_type="qwen3", head_dim=32, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 1_000.0}),
    "gemma": dict(model_type="gemma", head_dim=16, hidden_act="gelu", rope_theta=1_000.0),
    "gemma2": dict(model_type="gemma2", head_dim=16, hidden_activation="gelu_pytorch_tanh",
                   query_pre_attn_scalar=24, attn_logit_softcapping=3.0,
                   final_logit_softcapping=15.0, sliding_window=4, rope_theta=1_000.0),
    "gemma3": dict(model_type="gemma3_text", head_dim=16, query_pre_attn_scalar=16,
                   sliding_window=4, sliding_window_pattern=2, rope_theta=1_000_000.0,
                   rope_local_base_freq=100.0, rope_scaling={"rope_type": "linear",
                                                             "factor": 4.0}),
    "gemma3_v5": dict(model_type="gemma3_text", head_dim=16, query_pre_attn_scalar=16,
                      sliding_window=5, attn_logit_softcapping=4.0,
                      layer_types=["full_attention", "sliding_attention", "sliding_attention"],
                      rope_parameters={
                          "full_attention": {"rope_type": "linear", "rope_theta": 10_000.0,
                                             "factor": 2.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}),
    "olmo2": dict(model_type="olmo2", rope_theta=500_000.0, tie_word_embeddings=False),
}
SHARDED = {"qwen2", "olmo2"}


def _config(name: str) -> dict:
    return {**_BASE, **CONFIGS[name]}


def _checkpoint(tmp_path, name: str, dtype=np.float32):
    hf = _config(name)
    tensors = random_tensors(hf, seed=len(name), dtype=dtype)
    write_checkpoint(tmp_path / name, hf, tensors, shards=3 if name in SHARDED else 1)
    return tmp_path / name, hf, tensors


def _tokens(batch=2, length=12, seed=0):
    return np.random.default_rng(seed).integers(0, _BASE["vocab_size"], (batch, length))


def _assert_matches_reference(model, hf, tensors, tokens):
    """Within 5e-6 of the largest logit: float32 lands within 2e-6 on these models, while
    tanh-for-exact GELU or eps 1e-6 for 1e-5 would be 1e-5 off."""
    want = forward(hf, tensors, tokens)
    got, _ = model(jnp.asarray(tokens))
    err = np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max()
    assert err <= 5e-6, err


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_the_float64_reference(tmp_path, name):
    path, hf, tensors = _checkpoint(tmp_path, name)
    tokens = _tokens()
    stock = models.from_pretrained(path, fused=False)
    fused = models.from_pretrained(path, fused=True)
    assert fused.cfg.fused and not stock.cfg.fused
    for model in (stock, fused, models.flashify_model(fused)):
        _assert_matches_reference(model, hf, tensors, tokens)


@pytest.mark.parametrize("name", ["llama3", "gemma2", "gemma3", "olmo2"])
def test_greedy_tokens_agree_across_layers_and_folding(tmp_path, name):
    """24 greedy tokens, identical for stock layers, jaxnorm layers and the flashified model;
    each is the argmax of the float64 reference over the decoded prefix."""
    path, hf, tensors = _checkpoint(tmp_path, name)
    prompt = _tokens(length=5, seed=1)
    fused = models.from_pretrained(path)
    variants = (models.from_pretrained(path, fused=False), fused, models.flashify_model(fused))
    decoded = [np.asarray(models.greedy_decode(m, jnp.asarray(prompt), 24)) for m in variants]
    for other in decoded[1:]:
        np.testing.assert_array_equal(decoded[0], other)
    sequence = np.concatenate([prompt, decoded[0]], axis=1)
    want = forward(hf, tensors, sequence)[:, prompt.shape[1] - 1:-1]
    top2 = np.sort(want, axis=-1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > 1e-3  # near-ties may fall either way in float32
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(np.argmax(want, -1)[clear], decoded[0][clear])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_save_then_load_is_the_same_checkpoint(tmp_path, name):
    path, hf, tensors = _checkpoint(tmp_path, name)
    model = models.from_pretrained(path)
    models.save_pretrained(model, tmp_path / "saved")
    saved = load_file(tmp_path / "saved" / "model.safetensors")
    assert set(saved) == set(tensors)
    for key, value in tensors.items():
        np.testing.assert_array_equal(saved[key], value, err_msg=key)
    again = models.from_pretrained(tmp_path / "saved")
    assert again.cfg == model.cfg
    _assert_matches_reference(again, json.loads((tmp_path / "saved" / "config.json")
                                                .read_text()), saved, _tokens())


@pytest.mark.parametrize("name", ["llama3", "qwen3", "gemma", "gemma2", "olmo2"])
def test_flashified_model_saves_as_the_network_it_computes(tmp_path, name):
    path, _, _ = _checkpoint(tmp_path, name)
    folded = models.flashify_model(models.from_pretrained(path))
    models.save_pretrained(folded, tmp_path / "folded")
    saved = load_file(tmp_path / "folded" / "model.safetensors")
    unit = 0.0 if folded.cfg.norm_offset else 1.0
    if folded.cfg.pre_norms:
        assert np.all(saved["model.layers.0.input_layernorm.weight"] == unit)
    reloaded = models.from_pretrained(tmp_path / "folded")
    assert not reloaded.cfg.folded
    tokens = jnp.asarray(_tokens())
    np.testing.assert_allclose(reloaded(tokens)[0], folded(tokens)[0], rtol=1e-5, atol=1e-5)
    refolded = models.params_of(models.flashify_model(reloaded))
    for a, b in zip(jax.tree.leaves(refolded), jax.tree.leaves(models.params_of(folded))):
        np.testing.assert_array_equal(a, b)  # folding unit gains changes nothing


def test_bfloat16_checkpoint_loads_as_stored_or_as_float32(tmp_path):
    path, hf, tensors = _checkpoint(tmp_path, "gemma2", dtype=ml_dtypes.bfloat16)
    as_stored = models.from_pretrained(path)
    assert as_stored.cfg.param_dtype == jnp.bfloat16
    assert as_stored.embed.embedding[...].dtype == jnp.bfloat16
    wide = models.from_pretrained(path, param_dtype=jnp.float32)
    kernel = wide.layers[0].attn_in.q.kernel[...]
    assert kernel.dtype == jnp.float32
    np.testing.assert_array_equal(
        kernel, tensors["model.layers.0.self_attn.q_proj.weight"].astype(np.float32).T)
    _assert_matches_reference(wide, hf, tensors, _tokens())


def _edited(tmp_path, name: str, edit_config=None, edit_tensors=None):
    hf, tensors = _config(name), random_tensors(_config(name), seed=0)
    if edit_config:
        edit_config(hf)
    if edit_tensors:
        edit_tensors(tensors)
    write_checkpoint(tmp_path / "bad", hf, tensors)
    return tmp_path / "bad"


@pytest.mark.parametrize("edit_config, edit_tensors, match", [
    (lambda c: c.update(model_type="mistral"), None, "unknown model_type 'mistral'"),
    (lambda c: c.update(model_type="gemma3"), None, "unknown model_type 'gemma3'"),
    (None, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"),
     r"missing tensors.*model\.layers\.1\.mlp\.up_proj\.weight"),
    (None, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": np.ones((8, 64))}),
     r"k_proj\.weight has shape \(8, 64\); the config implies \(32, 64\)"),
    (None, lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": np.ones(64)}),
     r"does not use.*o_proj\.bias"),
    (lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}), None,
     "rope type='yarn' is not implemented"),
    (lambda c: c.update(rope_scaling={"type": "dynamic", "factor": 2.0}), None,
     "rope type='dynamic' is not implemented"),
    (lambda c: c.update(use_sliding_window=True), None, "use_sliding_window"),
    (lambda c: c.update(partial_rotary_factor=0.5), None, "partial_rotary_factor"),
    (lambda c: c.update(hidden_act="relu"), None, "hidden_act='relu'"),
    (lambda c: c.update(layer_types=["sliding_attention"] * 3), None, "sliding layers"),
])
def test_clear_errors(tmp_path, edit_config, edit_tensors, match):
    path = _edited(tmp_path, "qwen2", edit_config, edit_tensors)
    with pytest.raises(models.CheckpointError, match=match):
        models.from_pretrained(path)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(models.CheckpointError, match="no config.json"):
        models.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(_config("llama3")))
    with pytest.raises(models.CheckpointError, match="model.safetensors"):
        models.from_pretrained(tmp_path)


def test_a_config_no_family_expresses_is_refused_on_save(tmp_path):
    odd = models.Transformer(models.llama(qk_norm=True, qk_norm_over="projection"),
                             rngs=nnx.Rngs(0))
    with pytest.raises(models.CheckpointError, match="no qwen3 architecture"):
        models.save_pretrained(odd, tmp_path)


def test_presets_name_the_real_families():
    assert not models.gemma().qk_norm  # Gemma 1 has no QK-norm
    assert models.gemma3().qk_norm and models.gemma3().local_rope_theta == 10_000.0
    assert models.olmo2().qk_norm_over == "projection" and not models.olmo2().pre_norms
    assert models.qwen2().qkv_bias and not models.qwen2().o_bias
    assert models.llama3().rope_scaling.kind == "llama3"
    assert models.gemma2(n_layers=4).layer_types == ("sliding", "full", "sliding", "full")


def test_gpu_parity_script_judges_the_jax_side(tmp_path):
    """bench/gpu/hf_parity.py's comparison, fed the float64 reference instead of torch
    (absent here): every row passes, and a wrong token is reported as a failure."""
    spec = importlib.util.spec_from_file_location(
        "hf_parity", Path(__file__).parents[1] / "bench" / "gpu" / "hf_parity.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    path, hf, tensors = _checkpoint(tmp_path, "gemma3")
    prompt = _tokens(length=script.PROMPT, seed=3)
    sequence = prompt
    for _ in range(script.STEPS):
        nxt = np.argmax(forward(hf, tensors, sequence)[:, -1], axis=-1)
        sequence = np.concatenate([sequence, nxt[:, None]], axis=1)
    logits, tokens = forward(hf, tensors, prompt), sequence[:, prompt.shape[1]:]
    rows = script.compare("gemma3_text", logits, tokens, path, prompt)
    assert len(rows) == 3 and all(row.endswith("| PASS |") for row in rows), rows
    tokens[1, 5] = (tokens[1, 5] + 1) % _BASE["vocab_size"]
    assert all("FAIL" in row for row in script.compare("gemma3_text", logits, tokens, path,
                                                       prompt))
    (row,) = script.post_norm_rows(m=8, d=64, widths=(32,), repeats=2)
    assert row.startswith("| attn out")


def test_loading_example_runs(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location(
        "load_checkpoint", Path(__file__).parents[1] / "examples" / "load_checkpoint.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    path, _, _ = _checkpoint(tmp_path, "olmo2")
    assert example.main([str(path), "--steps", "6", "--save", str(tmp_path / "out")]) == 0
    assert "greedy tokens identical" in capsys.readouterr().out
    assert models.from_pretrained(tmp_path / "out").cfg.pre_norms is False


GOLDEN = Path(__file__).parent / "data" / "hf_golden.json"


def _check_golden(entry: dict, tmp_path) -> None:
    """Rebuild the checkpoint of one bench/gpu/hf_parity.py entry and hold the loader (and
    the float64 reference) to the logits and greedy tokens transformers produced."""
    hf, prompt = entry["config"], np.asarray(entry["prompt"])
    tensors = random_tensors(hf, entry["seed"])
    write_checkpoint(tmp_path / entry["family"], hf, tensors)
    want = np.asarray(entry["logits"], np.float64).reshape(*prompt.shape, -1)
    scale = np.abs(want).max()
    assert np.abs(forward(hf, tensors, prompt) - want).max() <= 1e-4 * scale
    fused = models.from_pretrained(tmp_path / entry["family"])
    variants = (models.from_pretrained(tmp_path / entry["family"], fused=False), fused,
                models.flashify_model(fused))
    for model in variants:
        got, _ = model(jnp.asarray(prompt))
        assert np.abs(np.asarray(got, np.float64) - want).max() <= 1e-4 * scale
        tokens = models.greedy_decode(model, jnp.asarray(prompt), len(entry["tokens"][0]))
        np.testing.assert_array_equal(tokens, entry["tokens"])


@pytest.mark.skipif(not GOLDEN.exists(), reason="tests/data/hf_golden.json not committed yet: "
                    "run bench/gpu/hf_parity.py where transformers is installed")
@pytest.mark.parametrize("index", range(7))
def test_transformers_golden_values(tmp_path, index):
    families = json.loads(GOLDEN.read_text())["families"]
    if index >= len(families):
        pytest.skip(f"the golden file holds {len(families)} families")
    _check_golden(families[index], tmp_path)


def test_golden_check_fails_on_a_wrong_value(tmp_path):
    """_check_golden on an entry made by the float64 reference passes, and fails once one
    golden token is wrong: the golden test can fail."""
    hf = _config("gemma2")
    prompt = _tokens(length=6, seed=4)
    tensors = random_tensors(hf, 5)
    sequence = prompt
    for _ in range(8):
        nxt = np.argmax(forward(hf, tensors, sequence)[:, -1], axis=-1)
        sequence = np.concatenate([sequence, nxt[:, None]], axis=1)
    entry = {"family": "gemma2", "config": hf, "seed": 5, "prompt": prompt.tolist(),
             "tokens": sequence[:, 6:].tolist(),
             "logits": forward(hf, tensors, prompt).ravel().tolist()}
    _check_golden(entry, tmp_path / "right")
    entry["tokens"][0][3] = (entry["tokens"][0][3] + 1) % _BASE["vocab_size"]
    with pytest.raises(AssertionError):
        _check_golden(entry, tmp_path / "wrong")
