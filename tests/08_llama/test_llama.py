"""Lab 08 · from GPT-2 to Llama: RMSNorm, SwiGLU, rotary positions, grouped-query attention,
HuggingFace Llama checkpoints, generation with a cache.

Expected values come from HuggingFace's Llama (stored in tests/08_llama/fixtures/), so no
test here needs PyTorch. RoPE is tested at positions with gaps and an offset, never only
0 … T−1: a rotation that ignores its positions would pass those.
"""

import json

import numpy as np
import pytest

from gptkit.state import state_diff
from gptkit.testing import (assert_close, assert_float32, checkpoint_on_disk, explains_errors, first_difference,
                            first_in_order, fixture_params, lab, load_fixture, raises_clearly, stored_diagnoses)

L = lab("llama")
LAB = "08_llama"
ABOUT = {"gqa_untied": "4 query heads over 2 key/value heads, untied head",
         "mha_tied": "3 heads, 3 key/value heads, tied head, rms_norm_eps 1e-5",
         "mqa_theta": "4 query heads over 1 key/value head, rope_theta 500000"}
CHECKPOINTS = list(ABOUT)  # the stored checkpoints, each with what it exercises
ROPE_HINT = ("HuggingFace pairs feature i with i + d/2 (rotate_half) and rotates the pair by m·θ_i, "
             "θ_i = base^(−2i/d), m the token's *position* (the positions argument)")
TRANSPOSE_HINT = ("torch's nn.Linear stores its weight (out, in); Linear here is (in, out): transpose every "
                  "…_proj.weight and lm_head.weight when loading")


def _set(layer, params, what):
    """Put ``params`` into the student's layer by name; a clear failure on a name mismatch."""
    __tracebackhide__ = True
    diff = state_diff(params, layer.state_dict())
    if diff:
        raise AssertionError(f"{what}: its parameters must be named as HuggingFace's Llama names them "
                             "(without the model. prefix), Linear weights (in, out): "
                             + diff.describe(expected="expected", actual="yours", unexpected="unexpected"))
    layer.load_state_dict(params)
    return layer.eval()


def _first_difference(model, case):
    """For ``assert_close(locate=…)``: the first sub-layer of ``model`` whose output differs
    from the reference's, each given the reference's inputs (fixture ``<case>_trace``)."""
    return lambda: first_difference(model, load_fixture(LAB, f"{case}_trace"), atol=1e-4)


def _gqa_model(rng_seed=0):
    f = load_fixture(LAB, "gqa_untied")
    config = json.loads(f["expected_config_json"].tobytes())
    model = L.LlamaModel(**config, rng=np.random.default_rng(rng_seed))
    return _set(model, fixture_params(f), "LlamaModel"), f


# --- rotary positions -------------------------------------------------------------------------

def test_rotate_half():
    f = load_fixture(LAB, "rope")
    out = L.rotate_half(f["x"])
    assert_float32(out, "rotate_half")
    x = np.asarray(f["x"])
    x1, x2 = x[..., :4], x[..., 4:]
    interleaved = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    assert_close(out, f["rotate_half"], what="rotate_half of (2, 3, 6, 8)", atol=0, rtol=0,
                 diagnoses={"the interleaved form, neighbours 2i and 2i+1 paired (−x_2i+1, x_2i): rotate_half pairs "
                            "feature i with i + d/2": interleaved,
                            "the minus sign on the wrong half, (x2, −x1): a rotation the other way":
                            np.concatenate([x2, -x1], axis=-1),
                            "the halves swapped without the minus sign, (x2, x1)": np.concatenate([x2, x1], axis=-1)},
                 hint="(x1, x2) → (−x2, x1) with x1 the first half of the last axis, x2 the second")


def test_rope_frequencies():
    for d, base in ((8, 10000.0), (16, 500000.0), (2, 10.0)):
        got = np.asarray(L.rope_frequencies(d, base))
        expected = base ** (-np.arange(0, d, 2) / d)
        assert_close(got, expected, what=f"rope_frequencies({d}, {base})", atol=1e-12, rtol=1e-6,
                     diagnoses={"rotation speeds θ_i = base^(−i/d): the exponent is −2i/d":
                                base ** (-np.arange(d // 2) / d),
                                "rotation speeds with a positive exponent, base^(+2i/d): θ_i falls from 1 as i grows":
                                base ** (np.arange(0, d, 2) / d),
                                "rotation speeds θ_i = base^(−4i/d) (i counted in steps of 2 and doubled again): "
                                "the exponent is −2i/d": base ** (-2 * np.arange(0, d, 2) / d)},
                     hint="θ_i = base^(−2i/d) for i = 0 … d/2 − 1")


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_apply_rope_matches_huggingface(theta):
    f = load_fixture(LAB, "rope")
    key = "rope" if theta == 10000.0 else "rope_theta_500000"
    out = L.apply_rope(f["x"], f["positions"], theta)
    assert_float32(out, "apply_rope")
    assert_close(out, f[key], what=f"apply_rope at positions {f['positions'].tolist()}, base {theta:g}",
                 diagnoses=stored_diagnoses(f, key), hint=ROPE_HINT)


def test_apply_rope_interleaved():
    f = load_fixture(LAB, "rope")
    out = L.apply_rope_interleaved(f["x"], f["positions"])
    assert_float32(out, "apply_rope_interleaved")
    assert_close(out, f["interleaved"], what=f"apply_rope_interleaved at positions {f['positions'].tolist()}",
                 diagnoses=stored_diagnoses(f, "interleaved"),
                 hint="pair feature 2i with 2i+1: y_2i = x_2i·cos − x_2i+1·sin, y_2i+1 = x_2i·sin + x_2i+1·cos")


@pytest.mark.parametrize("d", [2, 8, 12])
def test_interleaved_to_half_maps_one_form_onto_the_other(d):
    perm = np.asarray(L.interleaved_to_half(d))
    expected = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
    assert perm.shape == (d,) and np.array_equal(perm, expected), (
        f"interleaved_to_half({d}) should be the even features then the odd ones, {expected.tolist()}, "
        f"got {perm.tolist()}")
    rng = np.random.default_rng(d)
    x = rng.standard_normal((2, 5, d)).astype(np.float32)
    pos = np.array([0, 2, 3, 11, 40])
    assert_close(L.apply_rope(x[..., perm], pos), L.apply_rope_interleaved(x, pos)[..., perm],
                 what=f"apply_rope(x[..., perm]) vs apply_rope_interleaved(x)[..., perm], d={d}",
                 hint="the two forms rotate the same pairs by the same angles, only stored in another order")


def test_rope_is_the_identity_at_position_zero():
    x = np.random.default_rng(1).standard_normal((3, 4, 8)).astype(np.float32)
    for fn in ("apply_rope", "apply_rope_interleaved"):
        assert_close(getattr(L, fn)(x, np.zeros(4, np.int64)), x, what=f"{fn} at position 0", atol=1e-6,
                     hint="at position 0 every angle m·θ_i is 0: the rotation changes nothing")


def test_rope_preserves_the_length_of_every_pair():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 7, 16)).astype(np.float32)
    pos = np.array([1, 5, 6, 19, 100, 101, 511])
    out = np.asarray(L.apply_rope(x, pos))
    half = lambda a: a[..., :8] ** 2 + a[..., 8:] ** 2  # noqa: E731 - the squared length of pair (i, i + d/2)
    assert_close(half(out), half(x), what="apply_rope: squared length of each pair (i, i + d/2)", atol=1e-4,
                 hint="a rotation keeps lengths: pair feature i with i + d/2 and use cos and sin of one angle")


@pytest.mark.parametrize("shift", [1, 7, 250])
def test_rope_scores_depend_only_on_relative_position(shift):
    rng = np.random.default_rng(shift)
    q = rng.standard_normal((1, 6, 8)).astype(np.float32)
    k = rng.standard_normal((1, 6, 8)).astype(np.float32)
    pos = np.array([0, 3, 4, 9, 10, 20])
    scores = lambda p: np.asarray(L.apply_rope(q, p)) @ np.swapaxes(np.asarray(L.apply_rope(k, p)), -1, -2)  # noqa
    assert_close(scores(pos + shift), scores(pos), what=f"q·k scores after every position moved by {shift}",
                 atol=1e-4, hint="rotating q by m·θ and k by n·θ makes their dot product depend on m − n only; "
                             "both must be rotated by the same rule, with the given positions")


def test_rope_keeps_float32_and_checks_positions():
    x = np.ones((2, 3, 4), np.float32)
    assert_float32(L.apply_rope(x, np.array([0, 1, 2])), "apply_rope")
    with raises_clearly(ValueError, when="apply_rope with 2 positions for 3 tokens"):
        L.apply_rope(x, np.array([0, 1]))


# --- RMSNorm and SwiGLU -----------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["small", "big"])
def test_rmsnorm_matches_huggingface(which):
    f = load_fixture(LAB, "rmsnorm")
    norm = L.RMSNorm(f[which].shape[-1], eps=float(f["eps"]))
    norm.weight = f["weight"]
    out = norm(f[which])
    assert_float32(out, "RMSNorm")
    what = ("RMSNorm(eps=1e-5) on inputs of size ~2e-3 (mean square ~4e-6: eps matters)" if which == "small"
            else "RMSNorm on inputs with a mean far from 0")
    x, w, eps = np.float64(f[which]), np.float64(f["weight"]), float(f["eps"])
    ms, var = (x * x).mean(-1, keepdims=True), x.var(-1, keepdims=True)
    mistakes = {"RMSNorm that subtracts the mean (LayerNorm without its bias): RMSNorm divides x itself by the root "
                "of its mean square": (x - x.mean(-1, keepdims=True)) / np.sqrt(var + eps) * w,
                "RMSNorm that subtracts the mean inside its statistic (np.var or np.std): it divides x by its standard "
                "deviation instead of the root of its mean square": x / np.sqrt(var + eps) * w,
                "RMSNorm with eps outside the square root (sqrt(mean(x²)) + eps)": x / (np.sqrt(ms) + eps) * w,
                "RMSNorm without eps: x / sqrt(mean(x²)); eps goes inside the square root": x / np.sqrt(ms) * w,
                "RMSNorm without its gain (weight)": x / np.sqrt(ms + eps)}
    assert_close(out, f[f"out_{which}"], what=what, diagnoses={**stored_diagnoses(f, f"out_{which}"), **mistakes},
                 atol=1e-5, rtol=1e-4,
                 hint="x / sqrt(mean(x²) + eps) · weight, over the last axis: no mean subtracted, eps inside the root")


def test_rmsnorm_output_has_unit_root_mean_square():
    x = (np.random.default_rng(3).standard_normal((4, 32)) * 5 + 2).astype(np.float32)
    out = np.asarray(L.RMSNorm(32)(x))
    assert_close(np.sqrt(np.mean(out.astype(np.float64) ** 2, axis=-1)), np.ones(4), what="root mean square of "
                 "RMSNorm's output (unit gain)", atol=1e-4, hint="divide x by the root of its mean square")


def test_rmsnorm_uses_its_eps():
    x = np.full((1, 4), 1e-3, np.float32)
    for eps in (1e-5, 1e-6):
        got = float(np.asarray(L.RMSNorm(4, eps=eps)(x))[0, 0])
        expected = 1e-3 / np.sqrt(1e-6 + eps)
        assert abs(got - expected) < 1e-4 * expected, (
            f"RMSNorm(eps={eps:g}) of a row of 1e-3: expected {expected:.6f}, got {got:.6f}: "
            "eps is the one given to the constructor, added inside the square root")


def test_silu():
    f = load_fixture(LAB, "swiglu")
    with np.errstate(over="raise"):
        with explains_errors("silu of values from −12 to 12", "exp(−x) overflows for large negative x in "
                                                               "float32 at −89: write the sigmoid stably"):
            out = L.silu(f["silu_in"])
    assert_float32(out, "silu")
    assert_close(out, f["silu_out"], what="silu", atol=1e-5, hint="silu(x) = x · sigmoid(x)")
    big = np.array([-200.0, 200.0], np.float32)
    with np.errstate(over="raise"):
        with explains_errors("silu of ±200", "exp(−x) overflows: write the sigmoid stably"):
            assert_close(L.silu(big), np.array([0.0, 200.0]), what="silu(±200)", atol=1e-6)


def test_swiglu_matches_huggingface():
    f = load_fixture(LAB, "swiglu")
    D, F = f["x"].shape[-1], f["param.gate_proj.weight"].shape[1]
    mlp = _set(L.SwiGLU(D, F, rng=np.random.default_rng(0)), fixture_params(f), "SwiGLU")
    x, (gate, up, down) = np.float64(f["x"]), (np.float64(f[f"param.{n}_proj.weight"]) for n in ("gate", "up", "down"))
    silu = lambda a: a / (1 + np.exp(-a))  # noqa: E731
    mistakes = {"the SiLU on the up branch instead of the gate branch: silu(gate_proj(x))·up_proj(x)":
                (x @ gate * silu(x @ up)) @ down,
                "the SiLU on both branches; it goes on the gate branch only, the up branch stays linear":
                (silu(x @ gate) * silu(x @ up)) @ down,
                "no SiLU at all; it goes on the gate branch: silu(gate_proj(x))·up_proj(x)": (x @ gate * (x @ up)) @ down,
                "the SiLU applied after the product, silu(gate·up); it goes on the gate branch alone":
                silu(x @ gate * (x @ up)) @ down}
    assert_close(mlp(f["x"]), f["out"], what="SwiGLU (gate and up weights differ)",
                 diagnoses={**stored_diagnoses(f, "out"), **mistakes},
                 hint="down_proj(silu(gate_proj(x)) * up_proj(x)), no biases")


# --- grouped-query attention -------------------------------------------------------------------------

def test_repeat_kv_groups_the_heads():
    f = load_fixture(LAB, "gqa")
    out = L.repeat_kv(f["kv"], 3)
    assert_close(out, f["repeated"], what="repeat_kv of 2 key/value heads for 6 query heads", atol=0, rtol=0,
                 diagnoses=stored_diagnoses(f, "repeated"),
                 hint="query head h uses key/value head h // n_rep: kv heads grouped (0, 0, 0, 1, 1, 1)")


def test_attention_at_positions_with_gaps():
    f = load_fixture(LAB, "gqa")
    attn = _set(L.LlamaAttention(32, 4, 2, 10000.0, rng=np.random.default_rng(0)), fixture_params(f), "LlamaAttention")
    out = attn(f["x"], f["positions"])
    assert_float32(out, "LlamaAttention")
    assert_close(out, f["attention"], what=f"LlamaAttention (4 query heads, 2 kv heads) at positions "
                                           f"{f['positions'].tolist()}", diagnoses=stored_diagnoses(f, "attention"),
                 hint="rotate q and k (not v) by their positions, repeat kv heads in groups, causal softmax, o_proj")


def test_attention_is_causal():
    model, _ = _gqa_model()
    ids = np.random.default_rng(4).integers(0, 64, (1, 10))
    other = ids.copy()
    other[0, 6:] = (other[0, 6:] + 1) % 64
    assert_close(model(other)[:, :6], model(ids)[:, :6], what="logits of positions 0–5 after tokens 6–9 changed",
                 hint="a position may attend to itself and the past only (causal_mask(T, S))")


def test_attention_keeps_nothing_between_calls():
    f = load_fixture(LAB, "gqa")

    def fresh():
        return _set(L.LlamaAttention(32, 4, 2, 10000.0, rng=np.random.default_rng(0)), fixture_params(f),
                    "LlamaAttention")

    attn, other = fresh(), f["positions"][::-1].cumsum()  # the same number of tokens, other positions
    first = attn(f["x"], f["positions"])
    second = attn(f["x"][:, ::-1], other)
    assert_close(first, f["attention"], what="LlamaAttention, first call", diagnoses=stored_diagnoses(f, "attention"))
    assert_close(second, fresh()(f["x"][:, ::-1], other), what=f"a second call of the same LlamaAttention at "
                 f"positions {other.tolist()} vs a fresh layer",
                 diagnoses={"the rotation of the first call's positions, kept on the layer and reused":
                            fresh()(f["x"][:, ::-1], f["positions"])},
                 hint="a layer keeps nothing from one call to the next: compute the rotation's angles for the "
                      "positions of this call")


# --- config and checkpoints ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", CHECKPOINTS)
def test_read_config(tmp_path, case):
    folder, f = checkpoint_on_disk(tmp_path, LAB, case)
    expected = json.loads(f["expected_config_json"].tobytes())
    got = L.read_config(folder)
    source = {"rms_norm_eps": "rms_norm_eps", "rope_theta": "rope_theta (rope_parameters.rope_theta)",
              "num_kv_heads": "num_key_value_heads", "tie_word_embeddings": "tie_word_embeddings"}
    assert isinstance(got, dict), f"read_config must return a dict, got {type(got).__name__}"
    for key, value in expected.items():
        assert key in got, f"read_config ({ABOUT[case]}): no {key!r} in the result"
        assert got[key] == value, (f"read_config ({ABOUT[case]}): {key} should be {value!r} (config.json's "
                                   f"{source.get(key, key)}), got {got[key]!r}")
    assert set(got) == set(expected), f"read_config: unexpected keys {sorted(set(got) - set(expected))}"


def test_read_config_older_layout_and_defaults(tmp_path):
    config = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 12, "max_position_embeddings": 16,
              "rope_theta": 250000.0, "rms_norm_eps": 1e-5}
    (tmp_path / "config.json").write_text(json.dumps(config))
    got = L.read_config(tmp_path)
    assert got["rope_theta"] == 250000.0, f"read_config: rope_theta at the top level of config.json, got {got}"
    assert got["rms_norm_eps"] == 1e-5, f"read_config: rms_norm_eps should come from config.json, got {got}"
    assert got["num_kv_heads"] == 2, "read_config: without num_key_value_heads there are as many kv heads as heads"
    assert got["tie_word_embeddings"] is False, "read_config: tie_word_embeddings defaults to False for Llama"


def test_to_model_layout_transposes_linear_weights():
    rng = np.random.default_rng(5)
    for name, shape in (("layers.0.self_attn.o_proj.weight", (6, 6)), ("layers.1.mlp.up_proj.weight", (10, 6)),
                        ("lm_head.weight", (7, 6))):
        w = rng.standard_normal(shape).astype(np.float32)
        assert_close(L.to_model_layout(name, w), w.T, what=f"to_model_layout({name!r}) of a {shape} weight",
                     atol=0, rtol=0, hint=TRANSPOSE_HINT,
                     diagnoses={"the checkpoint's (out, in) weight returned as it is, not transposed": w})
    for name, shape in (("embed_tokens.weight", (7, 6)), ("norm.weight", (6,))):
        w = rng.standard_normal(shape).astype(np.float32)
        assert_close(L.to_model_layout(name, w), w, what=f"to_model_layout({name!r})", atol=0, rtol=0,
                     hint="embeddings (V, D) and RMSNorm gains are stored as the model holds them")


def test_model_name():
    for stored, expected in {"model.layers.3.mlp.gate_proj.weight": "layers.3.mlp.gate_proj.weight",
                             "model.embed_tokens.weight": "embed_tokens.weight", "lm_head.weight": "lm_head.weight",
                             "model.norm.weight": "norm.weight",
                             "model.layers.0.self_attn.rotary_emb.inv_freq": None}.items():
        got = L.model_name(stored)
        assert got == expected, f"model_name({stored!r}) should be {expected!r}, got {got!r}"


@pytest.mark.parametrize("case", CHECKPOINTS)
def test_load_llama_matches_huggingface_logits(tmp_path, case):
    folder, f = checkpoint_on_disk(tmp_path, LAB, case)
    with explains_errors(f"load_llama on a checkpoint saved by transformers ({ABOUT[case]})", TRANSPOSE_HINT):
        model = L.load_llama(folder)
    logits = model(f["ids"])
    assert_float32(logits, "LlamaModel logits")
    assert_close(logits, f["logits"], what=f"logits vs LlamaForCausalLM ({ABOUT[case]})", atol=1e-4,
                 diagnoses=stored_diagnoses(f, "logits"), locate=_first_difference(model, case))


def test_model_with_given_parameters_matches_huggingface():
    model, f = _gqa_model()
    assert_close(model(f["ids"]), f["logits"], what="LlamaModel with the checkpoint's parameters set by name",
                 atol=1e-4, diagnoses=stored_diagnoses(f, "logits"), locate=_first_difference(model, "gqa_untied"),
                 hint="embed → blocks (RMSNorm, attention with RoPE, RMSNorm, SwiGLU, residuals) → norm → lm_head")


def test_positions_shifted_together_change_nothing():
    model, f = _gqa_model()
    ids = f["ids"][:, :9]
    assert_close(model(ids, np.arange(9) + 13), model(ids), what="logits with every position moved by 13",
                 atol=1e-4, hint="RoPE makes attention depend on relative positions only")


# --- the cache and generation ----------------------------------------------------------------------------

@pytest.mark.parametrize("case", CHECKPOINTS)
def test_cached_logits_equal_the_full_forward(tmp_path, case):
    folder, f = checkpoint_on_disk(tmp_path, LAB, case)
    with explains_errors(f"load_llama ({ABOUT[case]})", TRANSPOSE_HINT):
        model = L.load_llama(folder)
    cache = L.LlamaCache(model, 2)
    parts, start = [], 0
    for n in f["chunks"].tolist():
        parts.append(L.forward_with_cache(model, f["ids"][:, start : start + n], cache))
        start += n
    assert cache.length == start, f"cache.length should be {start} after {start} tokens, got {cache.length}"
    bounds = np.cumsum([0, *f["chunks"].tolist()])
    names = [f"chunk {i + 1} (positions {a}…{b - 1})" for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    yours = dict(zip(names, parts))
    expected = {name: f["cached_logits"][:, a:b] for name, a, b in zip(names, bounds, bounds[1:])}
    first = first_in_order(names, yours, expected, what="logits", atol=1e-4)
    hint = ("the first chunk goes into an empty cache: there forward_with_cache must give model(ids)'s logits"
            if first and f"`{names[0]}`" in first.split(";")[0] else
            "the chunks before agree, so what the cache carries over is wrong: new tokens sit at positions "
            "cache.length …, attend to every cached key and value, and each key is rotated once, before it is stored")
    assert_close(np.concatenate(parts, axis=1), f["cached_logits"], atol=1e-4,
                 what=f"logits fed through the cache in chunks {f['chunks'].tolist()} ({ABOUT[case]})",
                 diagnoses=stored_diagnoses(f, "cached_logits"), locate=lambda: first, hint=hint)


def test_cache_stores_rotated_keys():
    model, f = _gqa_model()
    ids = f["ids"][:, :5]
    cache = L.LlamaCache(model, 2)
    L.forward_with_cache(model, ids, cache)
    block = model.layers[0]
    x = block.input_layernorm(model.embed_tokens(ids))
    _, k, v = block.self_attn.project(x, np.arange(5))
    moved = {f"the keys rotated to positions {s} … {s + 4}: the first tokens sit at positions 0 … T − 1, cache.length "
             f"on (an offset off by {s})": block.self_attn.project(x, np.arange(s, s + 5))[1] for s in (1, 2)}
    assert_close(np.asarray(cache.keys[0])[:, :, :5], k, what="cache.keys[0] after 5 tokens",
                 diagnoses={**moved, "keys stored before their rotation: rotate them to their positions first":
                            block.self_attn.project(x, np.zeros(5, np.int64))[1]},
                 hint="store the keys already rotated to their positions (project's k)")
    assert_close(np.asarray(cache.values[0])[:, :, :5], v, what="cache.values[0] after 5 tokens")


@pytest.mark.parametrize("case", CHECKPOINTS)
def test_greedy_generate_matches_huggingface(tmp_path, case):
    folder, f = checkpoint_on_disk(tmp_path, LAB, case)
    with explains_errors(f"load_llama ({ABOUT[case]})", TRANSPOSE_HINT):
        model = L.load_llama(folder)
    n = f["greedy"].shape[1] - f["prompt"].shape[1]
    for use_cache in (True, False):
        out = np.asarray(L.generate(model, f["prompt"], n, use_cache=use_cache))
        assert out.shape == f["greedy"].shape, f"generate: expected shape {f['greedy'].shape}, got {out.shape}"
        if not np.array_equal(out, f["greedy"]):
            b, t = (int(i) for i in np.argwhere(out != f["greedy"])[0])
            raise AssertionError(f"greedy generate(use_cache={use_cache}) ({ABOUT[case]}): first difference at row "
                                 f"{b}, position {t}: HuggingFace chose {int(f['greedy'][b, t])}, yours {int(out[b, t])}")


# --- positions through the whole model ----------------------------------------------------------------

POSITIONS_HINT = ("positions is an argument all the way down: LlamaModel passes it to every block, each block to "
                  "its attention, which rotates q and k by those positions (not by 0 … T−1)")


def _positions_model():
    f = load_fixture(LAB, "positions")
    config = json.loads(f["expected_config_json"].tobytes())
    model = L.LlamaModel(**config, rng=np.random.default_rng(0))
    return _set(model, fixture_params(f), "LlamaModel"), f


def test_block_at_positions_with_gaps_matches_huggingface():
    model, f = _positions_model()
    out = model.layers[0](f["block_in"], f["positions"])
    assert_float32(out, "LlamaBlock")
    assert_close(out, f["block_out"], what=f"LlamaBlock (HuggingFace's first decoder layer) at positions "
                                           f"{f['positions'].tolist()}", atol=1e-4,
                 diagnoses=stored_diagnoses(f, "block_out"), hint=POSITIONS_HINT)


def test_model_at_positions_with_gaps_matches_huggingface():
    model, f = _positions_model()
    logits = model(f["ids"], f["positions"])
    found = stored_diagnoses(f, "logits")
    if np.allclose(model.layers[0](f["block_in"], f["positions"]), f["block_out"], atol=1e-4):
        found = {k: v for k, v in found.items() if "LlamaBlock" not in k}  # the block is right: the model is not
    assert_close(logits, f["logits"], what=f"logits vs LlamaForCausalLM with position_ids {f['positions'].tolist()}",
                 atol=1e-4, diagnoses=found, hint=POSITIONS_HINT)


# --- defaults the README states ---------------------------------------------------------------------

def test_read_config_defaults_when_the_config_omits_them(tmp_path):
    config = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": None, "intermediate_size": 12,
              "max_position_embeddings": 16}
    (tmp_path / "config.json").write_text(json.dumps(config))
    got = L.read_config(tmp_path)
    assert isinstance(got, dict), f"read_config must return a dict, got {type(got).__name__}"
    for key, want, why in (("rms_norm_eps", 1e-6, "rms_norm_eps absent: Llama's default 1e-6"),
                           ("rope_theta", 10000.0, "rope_theta absent (top level and rope_parameters): 10000"),
                           ("num_kv_heads", 2, "num_key_value_heads null: as many key/value heads as heads"),
                           ("tie_word_embeddings", False, "tie_word_embeddings absent: False")):
        assert got.get(key) == want, f"read_config on a config.json with {why}: {key} should be {want!r}, got " \
                                     f"{got.get(key)!r}"


# --- generation that stops at EOS ---------------------------------------------------------------------

def test_greedy_generate_stops_at_eos():
    model, _ = _positions_model()
    f = load_fixture(LAB, "eos")
    n = 10
    for which, story in (("all", "every row emits it before the limit: generation stops once the last row has "
                                 "(its EOS appended)"),
                         ("some", "some rows emit it: they emit only EOS afterwards, the others go on to the limit"),
                         ("none", "no row emits it: every row gets max_new_tokens tokens")):
        eos, want = int(f[f"eos_{which}"]), f[f"tokens_{which}"]
        for use_cache in (True, False):
            got = np.asarray(L.generate(model, f["prompt"], n, eos_token_id=eos, use_cache=use_cache))
            assert got.shape == want.shape and np.array_equal(got, want), (
                f"greedy generate(max_new_tokens={n}, eos_token_id={eos}, use_cache={use_cache}), where {story}: "
                f"HuggingFace's generate() gives {want.tolist()}, yours {got.tolist()}")


def test_generate_keeps_nothing_between_calls():
    model, f = _positions_model()
    e = load_fixture(LAB, "eos")
    first = np.asarray(L.generate(model, e["prompt"], 6))
    second = np.asarray(L.generate(model, f["ids"][:, :4], 6))
    fresh, _ = _positions_model()
    assert np.array_equal(second, np.asarray(L.generate(fresh, f["ids"][:, :4], 6))), (
        "generate on a second prompt, after a first call on the same model, differs from generate on a fresh "
        "model: build a new cache in every call, nothing is kept on the model")
    assert np.array_equal(first, e["tokens_none"][:, :first.shape[1]]), (
        f"greedy generate: HuggingFace gives {e['tokens_none'][:, :first.shape[1]].tolist()}, yours {first.tolist()}")
