"""Stripped decoders: lab 06's GPT-2 and lab 08's Llama decoding step with everything but
the arithmetic taken out, for the decoding benchmarks' "stripped step" run.

They answer one question: how near the memory-bandwidth bound can a NumPy decoder come
on this machine at all? Against the reference decoders they leave out the input checks,
the layers' calls and their (B, T, D) shapes (one token is a 1-D row), dropout and the
sampling options, and they fold each norm and the softmax into the fewest NumPy calls.
What they keep: the model's own weight arrays, in the layout the model holds them (so
the products are the ones the reference runs, and the ones ``common.matvecs_run`` times
alone), the reference's KV cache buffers, and the same float32 arithmetic up to rounding
order. The prompt goes through the reference's ``forward_with_cache`` (one pass), and
every later token through the stripped step; greedy, batch 1. The benchmarks print
whether the tokens equal the reference's.

Three speeds then frame a decoder: the products alone (the most BLAS allows), the
stripped step (the most NumPy allows, every other operation of a step at its fewest
calls) and the reference (the lab's structure on top). Not for students: nothing here
checks its input.
"""

from __future__ import annotations

import math

import numpy as np


def _greedy(first_logits: np.ndarray, step, prompt: np.ndarray, n: int) -> np.ndarray:
    """(1, T + n) int64: the prompt, then n greedy tokens; ``step(token, position)`` returns
    the next logits (V,) and ``first_logits`` are the prompt's last position's."""
    T = prompt.shape[1]
    out = np.empty((1, T + n), np.int64)
    out[0, :T] = prompt[0]
    logits = first_logits
    for i in range(n):
        out[0, T + i] = token = int(logits.argmax())
        if i + 1 < n:
            logits = step(token, T + i)
    return out


def _attend(q: np.ndarray, K: np.ndarray, V: np.ndarray, S: int, d: int) -> np.ndarray:
    """One query per head over the first S cached positions: q (G, r, d), the r query
    heads of each of G key/value heads; K, V (G, L, d). Returns (G·r·d,)."""
    scores = q @ K[:, :S].swapaxes(1, 2) * (1.0 / math.sqrt(d))  # (G, r, S)
    w = np.exp(scores - scores.max(axis=2, keepdims=True))
    return ((w @ V[:, :S]) / w.sum(axis=2, keepdims=True)).reshape(-1)


def gpt2_generate(model, prompt: np.ndarray, n: int, generation) -> np.ndarray:
    """Lab 06's greedy ``generate(model, prompt, n, temperature=0)`` for a batch of one,
    stripped; ``generation`` is the reference lab 06 module (its cache and prompt pass)."""
    cache = generation.KVCache(model, 1)
    first = generation.forward_with_cache(model, prompt, cache)[0, -1]
    return _greedy(first, gpt2_step(model, cache), prompt, n)


def gpt2_step(model, cache, product=np.matmul):
    """The stripped step ``step(token, position)`` → logits (V,) over lab 06's KVCache
    ``cache`` (batch one, holding the positions before ``position``). Every weight product
    goes through ``product(x, W)`` (``x @ W``, the head's W is ``wte.weight.T``), so that a
    probe can time the step's products alone, or the step without them
    (``threads_probe.py``)."""
    D, H = model.d_model, model.h[0].attn.num_heads
    d = D // H
    c = math.sqrt(2.0 / math.pi)
    wte, wpe = model.wte.weight, model.wpe.weight

    def layer_norm(x, ln):
        x = x - x.mean()
        return x * (ln.weight / math.sqrt(float(x @ x) / D + ln.eps)) + ln.bias

    def step(token: int, pos: int) -> np.ndarray:
        x = wte[token] + wpe[pos]
        for b, K, V in zip(model.h, cache.keys, cache.values):
            a, mlp = b.attn, b.mlp
            q, k, v = np.split(product(layer_norm(x, b.ln_1), a.c_attn.weight) + a.c_attn.bias, 3)
            K[0, :, pos], V[0, :, pos] = k.reshape(H, d), v.reshape(H, d)
            x = x + (product(_attend(q.reshape(H, 1, d), K[0], V[0], pos + 1, d), a.c_proj.weight) + a.c_proj.bias)
            h = product(layer_norm(x, b.ln_2), mlp.c_fc.weight) + mlp.c_fc.bias
            h = 0.5 * h * (1.0 + np.tanh(c * (h + 0.044715 * h * h * h)))
            x = x + (product(h, mlp.c_proj.weight) + mlp.c_proj.bias)
        return product(layer_norm(x, model.ln_f), wte.T)

    return step


def llama_generate(model, prompt: np.ndarray, n: int, llama) -> np.ndarray:
    """Lab 08's greedy ``generate(model, prompt, n)`` for a batch of one, stripped;
    ``llama`` is the reference lab 08 module (its cache, prompt pass and RoPE angles)."""
    attn = model.layers[0].self_attn
    H, G, d, D = attn.num_heads, attn.num_kv_heads, attn.d_head, model.d_model
    half = d // 2

    def rms_norm(x, norm):
        return x * (norm.weight / math.sqrt(float(x @ x) / D + norm.eps))

    def rope(x, cos, sin):  # x (heads, d): x·cos + rotate_half(x)·sin
        return x * cos + np.concatenate((-x[:, half:], x[:, :half]), axis=1) * sin

    cache = llama.LlamaCache(model, 1)
    first = llama.forward_with_cache(model, prompt, cache)[0, -1]
    head = model.embed_tokens.weight.T if model.lm_head is None else model.lm_head.weight

    def step(token: int, pos: int) -> np.ndarray:
        cos, sin = llama.rope_angles(np.array([pos]), d, attn.rope_theta)  # (1, d) each
        x = model.embed_tokens.weight[token]
        for b, K, V in zip(model.layers, cache.keys, cache.values):
            a, mlp = b.self_attn, b.mlp
            h = rms_norm(x, b.input_layernorm)
            q = rope((h @ a.q_proj.weight).reshape(H, d), cos, sin)
            K[0, :, pos] = rope((h @ a.k_proj.weight).reshape(G, d), cos, sin)
            V[0, :, pos] = (h @ a.v_proj.weight).reshape(G, d)
            x = x + _attend(q.reshape(G, H // G, d), K[0], V[0], pos + 1, d) @ a.o_proj.weight
            h = rms_norm(x, b.post_attention_layernorm)
            g = h @ mlp.gate_proj.weight
            x = x + (g / (1.0 + np.exp(-g)) * (h @ mlp.up_proj.weight)) @ mlp.down_proj.weight
        return rms_norm(x, model.norm) @ head

    with np.errstate(over="ignore"):  # e^−g overflows to inf for g ≪ 0, where silu(g) is −0
        return _greedy(first, step, prompt, n)
