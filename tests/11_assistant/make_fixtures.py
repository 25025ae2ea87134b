"""Fixtures for lab 11, made by PyTorch autograd and HuggingFace and checked against the
reference solution.

- ``chat``: a byte-level BPE with a few merges (so that a token is not a character), three
  conversations (several turns, one that opens with the assistant, an empty answer), their
  ids and masks, the prompts that ask for their last answer, and the three padded together;
- ``masked_ce``: the masked mean cross-entropy and its gradient from ``torch.autograd`` on
  logits whose mask leaves out whole rows and the tails of others;
- ``sft``: a small GPT-2 with every parameter random and the ``chat`` batch, HuggingFace's
  loss with ``labels`` set to −100 off the mask and every parameter's gradient;
- ``lora``: a Linear with an adapter (α/r = 2), the output, the gradients with respect to x,
  A and B from ``torch.autograd``, and the merged weight;
- ``lora_model``: a small GPT-2 with adapters on every Linear (A and B random), its logits,
  and the adapters' gradients of the next-token loss, by ``torch.func.functional_call`` with
  W + (α/r)·A @ B in place of each adapted weight, in float64;
- ``logprobs``: each next token's log-probability and a masked sum under a small GPT-2;
- ``advantages``: group advantages of rewards with mixed groups, all-equal groups (right and
  wrong) and a group of graded rewards, by a float64 formula;
- ``grpo``: the clipped loss with the k3 penalty and its gradient from ``torch.autograd``, in
  two settings (the defaults; a tight clip with a heavy KL), with ratios on both sides of the
  clip under positive and negative advantages; and k3 itself;
- ``dpo``: DPO's loss and gradients from ``torch.autograd`` at β 0.1 and 0.5;
- ``rl_update``: one GRPO update of a small GPT-2 in PyTorch on fixed sampled sequences (the
  sampling policy's and a reference model's log-probabilities given), then one
  ``torch.optim.AdamW`` step: the loss, every parameter and both AdamW moments after it;
- ``dpo_model``: DPO's loss and every parameter's gradient on padded chosen and rejected
  answers, from HuggingFace.

Beside the right answers: what each catalogued mistake of ``solutions/11_assistant/bugs.toml``
whose ``diagnose`` names the case outputs (``grader.fixtures.diagnoses``), so a failing test
can name the mistake.
"""

import numpy as np

from gptkit.checkpoints import GPT2Shape, hf_model, random_gpt2_state
from grader.fixtures import diagnoses

NEEDS_TORCH = True
LAB = "11_assistant"

CORPUS = ("What is 347+85? 432. What is 12+30? 42. Hello! What is the sum of these? "
          "Hi there, what is it? I start. ok. 99+1 is 100. ") * 4
N_MERGES = 24
CONVERSATIONS = [
    [("user", "What is 347+85?"), ("assistant", "432")],
    [("user", "Hi there"), ("assistant", "Hello! What is the sum?"), ("user", "What is 12+30?"),
     ("assistant", "42")],
    [("assistant", "I start."), ("user", "ok"), ("assistant", "")],
]
PAD_ID = 7  # not 0: padding with zeros instead of pad_id must show
LORA_ALPHA, LORA_RANK = 6.0, 3  # scale α/r = 2: neither 1 (no scale) nor r/α = 0.5
MODEL_LORA_ALPHA, MODEL_LORA_RANK = 4.0, 2
SMALL = GPT2Shape(vocab_size=13, d_model=16, num_layers=2, num_heads=2, max_seq_len=12)
GRPO_SETTINGS = {"default": {"clip_eps": 0.2, "kl_coef": 0.04}, "tight": {"clip_eps": 0.1, "kl_coef": 0.5}}
DPO_BETAS = {"b01": 0.1, "b05": 0.5}
RL = {"clip_eps": 0.2, "kl_coef": 0.1}
RL_ADAMW = {"lr": 0.01, "betas": (0.8, 0.95), "eps": 1e-3, "weight_decay": 0.1}


def _t(x, grad=False):
    import torch

    return torch.tensor(np.asarray(x, np.float64), requires_grad=grad)


def messages(conversation):
    return [{"role": r, "content": c} for r, c in conversation]


def _chat_case(tk, a):
    vocab, merges = tk.train_bpe(CORPUS, 256 + N_MERGES)
    inverse = {v: k for k, v in vocab.items()}
    merge_ids = np.array([[inverse[left], inverse[right]] for left, right in merges], dtype=np.int64)
    tok = tk.Tokenizer(vocab, merges, special_tokens=a.CHAT_SPECIAL_TOKENS)
    case = {"merges": merge_ids, "pad_id": np.int64(PAD_ID)}
    for i, conv in enumerate(CONVERSATIONS):
        case[f"roles.{i}"] = np.array([r for r, _ in conv])
        case[f"contents.{i}"] = np.array([c for _, c in conv])
    # what the template is, spelled out: each turn's ids, encoded on their own
    for i, conv in enumerate(CONVERSATIONS):
        ids, mask = [], []
        for who, text in conv:
            answer = who == "assistant"
            body = tok.encode(text)
            ids += tok.encode(a.ASSISTANT if answer else a.USER) + body
            mask += [False] + [answer] * len(body)
            ids += tok.encode(a.END) if answer else []
            mask += [True] if answer else []
        case[f"ids.{i}"], case[f"mask.{i}"] = np.array(ids, np.int64), np.array(mask, bool)
        last_user = max(k for k, (r, _) in enumerate(conv) if r == "user")
        prompt = [x for k in range(last_user + 1) for x in
                  tok.encode(a.USER if conv[k][0] == "user" else a.ASSISTANT) + tok.encode(conv[k][1])
                  + (tok.encode(a.END) if conv[k][0] == "assistant" else [])]
        case[f"prompt.{i}"] = np.array(prompt + tok.encode(a.ASSISTANT), np.int64)
    width = max(len(case[f"ids.{i}"]) for i in range(len(CONVERSATIONS)))
    case["batch_ids"] = np.full((len(CONVERSATIONS), width), PAD_ID, np.int64)
    case["batch_mask"] = np.zeros((len(CONVERSATIONS), width), bool)
    for i in range(len(CONVERSATIONS)):
        n = len(case[f"ids.{i}"])
        case["batch_ids"][i, :n], case["batch_mask"][i, :n] = case[f"ids.{i}"], case[f"mask.{i}"]
    case["vocab_size"] = np.int64(tok.vocab_size)

    def outputs(m):
        out = {}
        for i, conv in enumerate(CONVERSATIONS):
            out[f"ids.{i}"], out[f"mask.{i}"] = m.render_chat(tok, messages(conv))
            last_user = max(k for k, (r, _) in enumerate(conv) if r == "user")
            out[f"prompt.{i}"] = m.render_prompt(tok, messages(conv[: last_user + 1]))
        out["batch_ids"], out["batch_mask"] = m.pad_batch(
            [(case[f"ids.{i}"], case[f"mask.{i}"]) for i in range(len(CONVERSATIONS))], PAD_ID)
        return out

    mine = outputs(a)
    for name, value in mine.items():
        assert np.array_equal(value, case[name]), f"chat: the reference's {name} differs from the template"
    return {**case, **diagnoses(LAB, "chat", case, outputs, "assistant")}


def _masked_ce_case(a, rng):
    import torch

    B, T, V = 3, 5, 7
    logits = rng.normal(0, 2, (B, T, V)).astype(np.float32)
    targets = rng.integers(0, V, (B, T))
    mask = np.array([[False, True, True, True, False], [False, False, False, False, False],
                     [True, True, False, False, False]])
    tx = _t(logits, True)
    per = torch.nn.functional.cross_entropy(tx.reshape(-1, V), torch.from_numpy(targets.reshape(-1)), reduction="none")
    m = torch.from_numpy(mask.reshape(-1).astype(np.float64))
    loss = (per * m).sum() / m.sum()
    loss.backward()
    case = {"logits": logits, "targets": targets, "mask": mask, "loss": np.float64(loss.item()),
            "dlogits": tx.grad.numpy()}

    def outputs(m):
        loss, dlogits = m.masked_cross_entropy(case["logits"], case["targets"], case["mask"])
        return {"loss": np.float64(loss), "dlogits": dlogits}

    mine = outputs(a)
    for name, value in mine.items():
        assert np.allclose(value, case[name], rtol=1e-5, atol=1e-7), f"masked_ce: the reference's {name} differs"
    return {**case, **diagnoses(LAB, "masked_ce", case, outputs, "assistant")}


def _model(g, state, shape):
    return g.GPTModel(**shape.model_kwargs(), rng=np.random.default_rng(0)).load_state_dict(state).eval()


def _sft_case(a, g, chat, rng):
    import torch

    ids, mask = chat["batch_ids"], chat["batch_mask"]
    shape = GPT2Shape(vocab_size=int(chat["vocab_size"]), d_model=16, num_layers=2, num_heads=2,
                      max_seq_len=ids.shape[1])
    state = random_gpt2_state(shape, rng)
    hf = hf_model(state, shape)
    labels = np.where(mask, ids, -100)
    out = hf(torch.from_numpy(ids), labels=torch.from_numpy(labels))  # shifted inside: mask[:, 1:] counts
    out.loss.backward()
    named = dict(hf.named_parameters())
    case = {"ids": ids, "mask": mask, "loss": np.float64(out.loss.item()),
            **{f"param.{k}": v for k, v in state.items()},
            **{f"grad.{k}": named["transformer." + k].grad.numpy().copy() for k in state}}

    def outputs(m):
        loss, grads = m.sft_loss_and_grads(_model(g, state, shape), ids, mask)
        return {"loss": np.float64(loss), **{f"grad.{k}": v for k, v in grads.items()}}

    mine = outputs(a)
    for name, value in mine.items():
        assert np.allclose(value, case[name], rtol=1e-3, atol=2e-6), f"sft: the reference's {name} differs from HF's"
    return {**case, **diagnoses(LAB, "sft", case, outputs, "assistant")}


def _lora_case(a, layers, rng):
    import torch

    d_in, d_out = 6, 5
    W, b = rng.normal(0, 0.5, (d_in, d_out)).astype(np.float32), rng.normal(0, 0.1, d_out).astype(np.float32)
    A = rng.normal(0, 0.4, (d_in, LORA_RANK)).astype(np.float32)
    B = rng.normal(0, 0.4, (LORA_RANK, d_out)).astype(np.float32)
    x, dout = rng.normal(0, 1, (2, 4, d_in)).astype(np.float32), rng.normal(0, 1, (2, 4, d_out)).astype(np.float32)
    scale = LORA_ALPHA / LORA_RANK
    tx, tA, tB = _t(x, True), _t(A, True), _t(B, True)
    y = tx @ _t(W) + _t(b) + scale * (tx @ tA) @ tB
    y.backward(_t(dout))
    case = {"W": W, "b": b, "A": A, "B": B, "x": x, "dout": dout, "alpha": np.float64(LORA_ALPHA),
            "rank": np.int64(LORA_RANK), "y": y.detach().numpy(), "dx": tx.grad.numpy(), "dA": tA.grad.numpy(),
            "dB": tB.grad.numpy(), "merged_weight": W.astype(np.float64) + scale * A.astype(np.float64) @ B}

    def outputs(m):
        base = layers.Linear(d_in, d_out, rng=np.random.default_rng(0))
        base.weight, base.bias = W.copy(), b.copy()
        layer = m.LoRALinear(base, LORA_RANK, LORA_ALPHA, rng=np.random.default_rng(1))
        layer.A, layer.B = A.copy(), B.copy()
        out = {"y": layer(x)}
        out["dx"], out["dA"], out["dB"] = layer.backward(dout, x)
        layer.merge()
        out["merged_weight"] = np.array(layer.base.weight)
        return out

    mine = outputs(a)
    for name, value in mine.items():
        assert np.allclose(value, case[name], rtol=1e-5, atol=1e-6), f"lora: the reference's {name} differs"
    return {**case, **diagnoses(LAB, "lora", case, outputs, "assistant")}


def _lora_model_case(a, g, tr, rng):
    import torch
    from torch.func import functional_call

    state = random_gpt2_state(SMALL, rng)
    hf = hf_model(state, SMALL).double()  # in float64: the stored gradients are the exact ones
    targets = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    adapters = {}
    for i in range(SMALL.num_layers):
        for t in targets:
            d_in, d_out = state[f"h.{i}.{t}.weight"].shape
            adapters[f"h.{i}.{t}"] = (rng.normal(0, 0.3, (d_in, MODEL_LORA_RANK)).astype(np.float32),
                                      rng.normal(0, 0.3, (MODEL_LORA_RANK, d_out)).astype(np.float32))
    ids = rng.integers(0, SMALL.vocab_size, (2, SMALL.max_seq_len))
    scale = MODEL_LORA_ALPHA / MODEL_LORA_RANK
    leaves = {name: (_t(A, True), _t(B, True)) for name, (A, B) in adapters.items()}
    replaced = {f"transformer.{name}.weight": _t(state[f"{name}.weight"]) + scale * (A @ B)
                for name, (A, B) in leaves.items()}
    out = functional_call(hf, replaced, (torch.from_numpy(ids[:, :-1]),))
    logits = out.logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, SMALL.vocab_size), torch.from_numpy(ids[:, 1:]).reshape(-1))
    loss.backward()
    case = {"ids": ids, "alpha": np.float64(MODEL_LORA_ALPHA), "rank": np.int64(MODEL_LORA_RANK),
            "logits": logits.detach().numpy(), "loss": np.float64(loss.item()),
            **{f"param.{k}": v for k, v in state.items()}}
    for name, (A, B) in adapters.items():
        case[f"A.{name}"], case[f"B.{name}"] = A, B
        case[f"dA.{name}"], case[f"dB.{name}"] = leaves[name][0].grad.numpy(), leaves[name][1].grad.numpy()

    def outputs(m):
        model = _model(g, state, SMALL)
        made = m.add_lora(model, MODEL_LORA_RANK, MODEL_LORA_ALPHA, rng=np.random.default_rng(3))
        for name, (A, B) in adapters.items():
            made[name].A, made[name].B = A.copy(), B.copy()
        result = {"logits": model(ids[:, :-1])}
        loss, grads = tr.loss_and_grads(model, ids[:, :-1], ids[:, 1:])
        result["loss"] = np.float64(loss)
        for key, value in m.lora_grads(grads, made).items():
            name, which = key.rsplit(".", 1)
            result[f"d{which}.{name}"] = value
        return result

    mine = outputs(a)
    for name, value in mine.items():
        assert np.allclose(value, case[name], rtol=1e-3, atol=2e-6), f"lora_model: the reference's {name} differs"
    return {**case, **diagnoses(LAB, "lora_model", case, outputs, "assistant")}


def _logprobs_case(a, g, rng):
    import torch

    state = random_gpt2_state(SMALL, rng)
    hf = hf_model(state, SMALL)
    ids = rng.integers(0, SMALL.vocab_size, (3, 9))
    mask = np.zeros(ids.shape, bool)
    mask[0, 4:], mask[1, 2:6], mask[2, 8] = True, True, True
    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.from_numpy(ids)).logits.double(), -1)
    token = torch.gather(logp[:, :-1], 2, torch.from_numpy(ids[:, 1:, None]))[..., 0].numpy()
    case = {"ids": ids, "mask": mask, "token_logprobs": token, "sequence_logprobs": (token * mask[:, 1:]).sum(1),
            **{f"param.{k}": v for k, v in state.items()}}

    def outputs(m):
        model = _model(g, state, SMALL)
        return {"token_logprobs": m.token_logprobs(model, ids), "sequence_logprobs": m.sequence_logprobs(model, ids, mask)}

    mine = outputs(a)
    for name, value in mine.items():
        assert np.allclose(value, case[name], rtol=1e-4, atol=1e-5), f"logprobs: the reference's {name} differs"
    return {**case, **diagnoses(LAB, "logprobs", case, outputs, "assistant")}


def _advantages_case(a):
    # the last group differs by little: dividing by std + eps and by √(var + eps) are far apart there
    rewards = np.array([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [0.5, 0.2, 0.9, 0.1],
                        [0.0, 0.001, 0.002, 0.001]], np.float32)
    r = rewards.astype(np.float64)
    adv = (r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-6)
    case = {"rewards": rewards, "advantages": adv}

    def outputs(m):
        return {"advantages": m.group_advantages(rewards)}

    mine = outputs(a)
    assert np.allclose(mine["advantages"], adv, rtol=1e-5, atol=1e-6), "advantages: the reference differs"
    return {**case, **diagnoses(LAB, "advantages", case, outputs, "assistant")}


def _grpo_inputs(rng):
    B, L = 4, 6
    logp = rng.uniform(-3, -0.2, (B, L)).astype(np.float32)
    # ratios spread over 0.6 … 1.5: inside the clip, above 1 + ε and below 1 − ε, in every row
    log_ratio = np.log(np.array([[0.6, 0.95, 1.5, 1.05, 1.3, 0.7], [1.5, 0.6, 1.0, 0.85, 1.25, 1.07],
                                 [0.7, 1.4, 0.93, 1.0, 0.75, 1.35], [1.3, 0.65, 1.13, 1.45, 0.87, 0.77]]))
    logp_old = (logp - log_ratio).astype(np.float32)
    logp_ref = (logp + rng.normal(0, 0.4, (B, L))).astype(np.float32)
    # 1.6 lies beyond 1 + ε: a clip applied to the advantage changes the loss there (elsewhere it does not)
    advantages = np.array([1.6, -0.8, 0.5, -1.5], np.float32)
    mask = np.array([[False, True, True, True, True, True], [False, False, True, True, False, False],
                     [True, True, True, True, True, True], [False, True, True, True, True, False]])
    return logp, logp_old, logp_ref, advantages, mask


def _grpo_torch(logp, logp_old, logp_ref, advantages, mask, clip_eps, kl_coef):
    import torch

    t = _t(logp, True)
    ratio = torch.exp(t - _t(logp_old))
    A = _t(advantages)[:, None]
    obj = torch.minimum(ratio * A, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * A)
    d = _t(logp_ref) - t
    k3 = torch.exp(d) - d - 1
    m = _t(mask.astype(np.float64))
    loss = -((obj - kl_coef * k3) * m).sum() / m.sum()
    loss.backward()
    return np.float64(loss.item()), t.grad.numpy(), k3.detach().numpy()


def _grpo_case(a, rng):
    logp, logp_old, logp_ref, advantages, mask = _grpo_inputs(rng)
    case = {"logp": logp, "logp_old": logp_old, "logp_ref": logp_ref, "advantages": advantages, "mask": mask}
    for key, s in GRPO_SETTINGS.items():
        case[f"loss.{key}"], case[f"dlogp.{key}"], k3 = _grpo_torch(logp, logp_old, logp_ref, advantages, mask, **s)
        case[f"clip_eps.{key}"], case[f"kl_coef.{key}"] = np.float64(s["clip_eps"]), np.float64(s["kl_coef"])
    case["k3"] = k3

    def outputs(m):
        out = {"k3": m.kl_k3(logp, logp_ref)}
        for key, s in GRPO_SETTINGS.items():
            loss, out[f"dlogp.{key}"] = m.grpo_loss(logp, logp_old, logp_ref, advantages, mask, **s)
            out[f"loss.{key}"] = np.float64(loss)
        return out

    mine = outputs(a)
    for name, value in mine.items():
        assert np.allclose(value, case[name], rtol=1e-5, atol=1e-6), f"grpo: the reference's {name} differs"
    return {**case, **diagnoses(LAB, "grpo", case, outputs, "assistant")}


def _dpo_case(a, rng):
    import torch

    N = 6
    pc, pr = rng.uniform(-30, -5, N).astype(np.float32), rng.uniform(-30, -5, N).astype(np.float32)
    rc, rr = (pc + rng.normal(0, 3, N)).astype(np.float32), (pr + rng.normal(0, 3, N)).astype(np.float32)
    case = {"policy_chosen": pc, "policy_rejected": pr, "ref_chosen": rc, "ref_rejected": rr}
    for key, beta in DPO_BETAS.items():
        tc, trj = _t(pc, True), _t(pr, True)
        z = beta * ((tc - _t(rc)) - (trj - _t(rr)))
        loss = -torch.nn.functional.logsigmoid(z).mean()
        loss.backward()
        case.update({f"beta.{key}": np.float64(beta), f"loss.{key}": np.float64(loss.item()),
                     f"d_chosen.{key}": tc.grad.numpy(), f"d_rejected.{key}": trj.grad.numpy()})

    def outputs(m):
        out = {}
        for key, beta in DPO_BETAS.items():
            loss, out[f"d_chosen.{key}"], out[f"d_rejected.{key}"] = m.dpo_loss(pc, pr, rc, rr, beta)
            out[f"loss.{key}"] = np.float64(loss)
        return out

    mine = outputs(a)
    for name, value in mine.items():
        assert np.allclose(value, case[name], rtol=1e-5, atol=1e-7), f"dpo: the reference's {name} differs"
    return {**case, **diagnoses(LAB, "dpo", case, outputs, "assistant")}


def _hf_token_logp(hf, ids):
    import torch

    logp = torch.log_softmax(hf(torch.from_numpy(ids)).logits, -1)
    return torch.gather(logp[:, :-1], 2, torch.from_numpy(ids[:, 1:, None]))[..., 0]


def _rl_update_case(a, g, tr, rng):
    import torch

    state, ref_state = random_gpt2_state(SMALL, rng), random_gpt2_state(SMALL, rng)
    policy, ref = hf_model(state, SMALL), hf_model(ref_state, SMALL)
    prompt_len = 4
    ids = rng.integers(0, SMALL.vocab_size, (4, SMALL.max_seq_len))
    ids[:, :prompt_len] = ids[0, :prompt_len]  # two prompts, two answers each
    ids[2:, :prompt_len] = (ids[0, :prompt_len] + 1) % SMALL.vocab_size
    mask = np.zeros(ids.shape, bool)
    for row, length in enumerate((8, 5, 8, 3)):  # answers of different lengths, padding after
        mask[row, prompt_len:prompt_len + length] = True
    with torch.no_grad():
        now = _hf_token_logp(policy, ids).numpy()
        logp_ref = _hf_token_logp(ref, ids).numpy().astype(np.float32)
    logp_old = (now + rng.normal(0, 0.3, now.shape)).astype(np.float32)  # sampled a few updates ago: ratios ≠ 1
    advantages = np.array([1.0, -1.0, 0.7, -0.7], np.float32)
    scored = _t(mask[:, 1:].astype(np.float64))
    logp = _hf_token_logp(policy, ids).double()
    ratio = torch.exp(logp - _t(logp_old))
    A = _t(advantages)[:, None]
    obj = torch.minimum(ratio * A, torch.clamp(ratio, 1 - RL["clip_eps"], 1 + RL["clip_eps"]) * A)
    d = _t(logp_ref) - logp
    loss = -((obj - RL["kl_coef"] * (torch.exp(d) - d - 1)) * scored).sum() / scored.sum()
    opt = torch.optim.AdamW(policy.parameters(), **RL_ADAMW)
    opt.zero_grad()
    loss.backward()
    named = dict(policy.named_parameters())
    grads = {k: named["transformer." + k].grad.numpy().copy() for k in state}
    opt.step()
    case = {"ids": ids, "mask": mask, "logp_old": logp_old, "logp_ref": logp_ref, "advantages": advantages,
            "loss": np.float64(loss.item()), "lr": np.float64(RL_ADAMW["lr"]), "betas": np.array(RL_ADAMW["betas"]),
            "eps": np.float64(RL_ADAMW["eps"]), "weight_decay": np.float64(RL_ADAMW["weight_decay"]),
            "clip_eps": np.float64(RL["clip_eps"]), "kl_coef": np.float64(RL["kl_coef"]),
            **{f"param.{k}": v for k, v in state.items()}, **{f"grad.{k}": v for k, v in grads.items()}}
    for k in state:
        p = named["transformer." + k]
        case[f"after.{k}"] = p.detach().numpy().copy()
        case[f"m.{k}"] = opt.state[p]["exp_avg"].numpy().copy()
        case[f"v.{k}"] = opt.state[p]["exp_avg_sq"].numpy().copy()

    def outputs(m):
        model = _model(g, state, SMALL)
        loss, grads = m.rl_loss_and_grads(model, ids, mask, logp_old, logp_ref, advantages, **RL)
        opt = tr.AdamW(model, **RL_ADAMW)
        opt.step(grads)
        params = model.state_dict()
        out = {"loss": np.float64(loss)}
        for k in state:
            out.update({f"grad.{k}": grads[k], f"after.{k}": params[k], f"m.{k}": opt.m[k], f"v.{k}": opt.v[k]})
        return out

    mine = outputs(a)
    for name, value in mine.items():
        assert np.allclose(value, case[name], rtol=1e-3, atol=2e-6), f"rl_update: the reference's {name} differs"
    return {**case, **diagnoses(LAB, "rl_update", case, outputs, "assistant")}


def _dpo_model_case(a, g, rng):
    import torch

    state = random_gpt2_state(SMALL, rng)
    hf = hf_model(state, SMALL)
    N, T, prompt_len = 3, 10, 4
    chosen = rng.integers(0, SMALL.vocab_size, (N, T))
    rejected = rng.integers(0, SMALL.vocab_size, (N, T))
    rejected[:, :prompt_len] = chosen[:, :prompt_len]  # each pair answers the same prompt
    chosen_mask, rejected_mask = np.zeros((N, T), bool), np.zeros((N, T), bool)
    for row, (lc, lr) in enumerate(((6, 4), (3, 6), (5, 5))):
        chosen_mask[row, prompt_len:prompt_len + lc] = True
        rejected_mask[row, prompt_len:prompt_len + lr] = True
    ref_chosen = rng.uniform(-25, -10, N).astype(np.float32)
    ref_rejected = rng.uniform(-25, -10, N).astype(np.float32)
    beta = 0.5
    seq_c = (_hf_token_logp(hf, chosen).double() * _t(chosen_mask[:, 1:].astype(np.float64))).sum(1)
    seq_r = (_hf_token_logp(hf, rejected).double() * _t(rejected_mask[:, 1:].astype(np.float64))).sum(1)
    z = beta * ((seq_c - _t(ref_chosen)) - (seq_r - _t(ref_rejected)))
    loss = -torch.nn.functional.logsigmoid(z).mean()
    loss.backward()
    named = dict(hf.named_parameters())
    case = {"chosen_ids": chosen, "chosen_mask": chosen_mask, "rejected_ids": rejected, "rejected_mask": rejected_mask,
            "ref_chosen": ref_chosen, "ref_rejected": ref_rejected, "beta": np.float64(beta),
            "loss": np.float64(loss.item()), **{f"param.{k}": v for k, v in state.items()},
            **{f"grad.{k}": named["transformer." + k].grad.numpy().copy() for k in state}}

    def outputs(m):
        loss, grads = m.dpo_loss_and_grads(_model(g, state, SMALL), chosen, chosen_mask, rejected, rejected_mask,
                                           ref_chosen, ref_rejected, beta=beta)
        return {"loss": np.float64(loss), **{f"grad.{k}": v for k, v in grads.items()}}

    mine = outputs(a)
    for name, value in mine.items():
        assert np.allclose(value, case[name], rtol=1e-3, atol=2e-6), f"dpo_model: the reference's {name} differs"
    return {**case, **diagnoses(LAB, "dpo_model", case, outputs, "assistant")}


def build() -> dict[str, dict[str, np.ndarray]]:
    import assistant as a
    import gpt as g
    import layers
    import tokenizer as tk
    import training as tr

    rng = np.random.default_rng(1111)
    chat = _chat_case(tk, a)
    return {"chat": chat, "masked_ce": _masked_ce_case(a, rng), "sft": _sft_case(a, g, chat, rng),
            "lora": _lora_case(a, layers, rng), "lora_model": _lora_model_case(a, g, tr, rng),
            "logprobs": _logprobs_case(a, g, rng), "advantages": _advantages_case(a), "grpo": _grpo_case(a, rng),
            "dpo": _dpo_case(a, rng), "rl_update": _rl_update_case(a, g, tr, np.random.default_rng(1112)),
            "dpo_model": _dpo_model_case(a, g, np.random.default_rng(1113))}
