"""Hidden checks for lab 11: shapes and settings the public tests do not use, against
independent float64 computations written here (hidden tests hold no stored answers)."""

import numpy as np

from gptkit.testing import assert_close, lab

A = lab("assistant")
TK = lab("tokenizer")
L3 = lab("layers")


def _byte_tokenizer():
    return TK.Tokenizer({i: bytes([i]) for i in range(256)}, [], special_tokens=list(A.CHAT_SPECIAL_TOKENS))


def test_two_assistant_turns_in_a_row():
    tok = _byte_tokenizer()
    user, assistant, end = (tok.encode(s)[0] for s in (A.USER, A.ASSISTANT, A.END))
    ids, mask = A.render_chat(tok, [{"role": "assistant", "content": "ab"}, {"role": "assistant", "content": "c"},
                                    {"role": "user", "content": "d"}])
    assert np.asarray(ids).tolist() == [assistant, 97, 98, end, assistant, 99, end, user, 100]
    assert np.asarray(mask).tolist() == [False, True, True, True, False, True, True, False, False]


def test_reward_of_an_empty_answer_and_a_long_one():
    tok = _byte_tokenizer()
    prompt = tok.encode("<|user|>say nothing<|assistant|>")
    n = len(prompt)
    assert A.reward(tok, n, np.array(prompt + tok.encode("<|end|>")), "") == 1.0
    assert A.reward(tok, n, np.array(prompt + tok.encode("x<|end|>")), "") == 0.0
    long = "1234567890" * 3
    assert A.reward(tok, n, np.array(prompt + tok.encode(long + "<|end|><|end|>")), long) == 1.0


def test_group_advantages_of_many_groups():
    rng = np.random.default_rng(11_001)
    rewards = (rng.random((7, 8)) < 0.4).astype(np.float32)
    rewards[2], rewards[5] = 1.0, 0.0
    r = rewards.astype(np.float64)
    std = r.std(1, keepdims=True)
    want = np.where(std > 0, (r - r.mean(1, keepdims=True)) / (std + 1e-6), 0.0)
    assert_close(A.group_advantages(rewards), want, atol=1e-5, what="group_advantages of 7 groups of 8")


def test_grpo_loss_on_long_answers():
    rng = np.random.default_rng(11_002)
    B, L, eps, beta = 6, 20, 0.3, 0.2
    logp = rng.uniform(-5, -0.05, (B, L))
    old = logp - rng.uniform(-0.7, 0.7, (B, L))
    ref = logp + rng.normal(0, 0.6, (B, L))
    adv = rng.normal(0, 1, B)
    mask = rng.random((B, L)) < 0.8
    logp, old, ref, adv = (a.astype(np.float32).astype(np.float64) for a in (logp, old, ref, adv))
    ratio = np.exp(logp - old)
    plain, clipped = ratio * adv[:, None], np.clip(ratio, 1 - eps, 1 + eps) * adv[:, None]
    d = ref - logp
    M = mask.sum()
    want_loss = -((np.minimum(plain, clipped) - beta * (np.exp(d) - d - 1)) * mask).sum() / M
    flat = clipped < plain
    want_grad = -(np.where(flat, 0.0, plain) - beta * (1 - np.exp(d))) * mask / M
    loss, dlogp = A.grpo_loss(*(a.astype(np.float32) for a in (logp, old, ref, adv)), mask, clip_eps=eps, kl_coef=beta)
    assert_close(np.float64(loss), want_loss, atol=1e-5, what="grpo_loss on 6 answers of 20 tokens")
    assert_close(dlogp, want_grad, atol=1e-6, rtol=1e-4, what="grpo_loss's dlogp on 6 answers of 20 tokens")


def test_dpo_with_large_margins_stays_finite():
    pc = np.array([-5.0, -400.0, -10.0], np.float32)
    pr = np.array([-400.0, -5.0, -10.5], np.float32)
    rc = np.array([-10.0, -10.0, -10.0], np.float32)
    rr = np.array([-10.0, -10.0, -10.0], np.float32)
    beta = 2.0
    z = beta * ((pc.astype(np.float64) - rc) - (pr - rr))
    loss, dc, dr = A.dpo_loss(pc, pr, rc, rr, beta)
    assert_close(np.float64(loss), np.logaddexp(0, -z).mean(), atol=1e-3, rtol=1e-5,
                 what="dpo_loss with margins of ±790 (exp overflows float32 there)")
    sig_neg = np.exp(-np.logaddexp(0, z))
    assert_close(dc, -beta * sig_neg / 3, atol=1e-6, what="d_policy_chosen with margins of ±790")
    assert_close(dr, beta * sig_neg / 3, atol=1e-6, what="d_policy_rejected with margins of ±790")


def test_lora_on_rows_with_rank_one():
    rng = np.random.default_rng(11_003)
    base = L3.Linear(7, 3, rng=np.random.default_rng(0))
    base.weight = rng.normal(0, 1, (7, 3)).astype(np.float32)
    base.bias = rng.normal(0, 1, 3).astype(np.float32)
    layer = A.LoRALinear(base, 1, 3.0, rng=np.random.default_rng(2))
    layer.A = rng.normal(0, 1, (7, 1)).astype(np.float32)
    layer.B = rng.normal(0, 1, (1, 3)).astype(np.float32)
    x, dout = rng.normal(0, 1, (5, 7)).astype(np.float32), rng.normal(0, 1, (5, 3)).astype(np.float32)
    W, b, Am, Bm = (np.asarray(v, np.float64) for v in (base.weight, base.bias, layer.A, layer.B))
    assert_close(layer(x), x @ W + b + 3.0 * (x @ Am) @ Bm, atol=1e-4, what="LoRALinear (rank 1, alpha 3) on (5, 7) rows")
    dx, dA, dB = layer.backward(dout, x)
    assert_close(dB, 3.0 * (x @ Am).T @ dout, atol=1e-4, what="dB, rank 1, on (5, 7) rows")
    assert_close(dA, 3.0 * x.T @ (dout @ Bm.T), atol=1e-4, what="dA, rank 1, on (5, 7) rows")
    assert_close(dx, dout @ W.T + 3.0 * (dout @ Bm.T) @ Am.T, atol=1e-4, what="dx, rank 1, on (5, 7) rows")


def test_masked_cross_entropy_of_large_logits():
    rng = np.random.default_rng(11_004)
    logits = (rng.normal(0, 1, (2, 4, 6)) * 500).astype(np.float32)
    targets = rng.integers(0, 6, (2, 4))
    mask = np.array([[True, False, True, True], [False, False, True, False]])
    z = logits.astype(np.float64)
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    want = -np.take_along_axis(logp, targets[..., None], -1)[..., 0][mask].mean()
    loss, dlogits = A.masked_cross_entropy(logits, targets, mask)
    assert_close(np.float64(loss), want, atol=1e-3, rtol=1e-5, what="masked_cross_entropy of logits near ±1500")
    assert np.isfinite(np.asarray(dlogits)).all(), "masked_cross_entropy's dlogits must stay finite for large logits"
