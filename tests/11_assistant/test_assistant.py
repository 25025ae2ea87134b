"""Lab 11 · the chat format, masked SFT, LoRA, sampling and the reward, GRPO, DPO.

Three kinds of checks, none needing PyTorch:

- stored fixtures from PyTorch autograd and HuggingFace (``make_fixtures.py``): the template
  and its mask on conversations of several turns, the masked loss and every gradient of a
  small GPT-2 fine-tuned on them, LoRA's output and gradients and a whole adapted model,
  log-probabilities, group advantages, the clipped loss in two settings, DPO, one RL update
  with AdamW's moments after it, with the catalogued mistakes' outputs beside them;
- gradient checks in float64 by central differences of formulas written here;
- properties: a zero B gives the base model's logits exactly; a zero advantage gives a zero
  gradient; identical policy and reference give a ratio of 1 and a KL of 0; equal rewards
  give zero advantages; more padding changes nothing; the reward reads only the answer.
"""

import math
import re

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gptkit.checkpoints import GPT2Shape, random_gpt2_state
from gptkit.memory import peak_memory
from gptkit.testing import (arguments_written_back, assert_close, assert_float32, assert_ndarray, explains_errors,
                            first_in_order, fixture_params, lab, load_fixture, numeric_gradient, raises_clearly,
                            same_object, stored_diagnoses)
from gptkit.testing.parameters import set_parameters

A = lab("assistant")
TK = lab("tokenizer")
G = lab("gpt")
L3 = lab("layers")
TR = lab("training")
GEN = lab("generation")
LAB = "11_assistant"
SMALL = GPT2Shape(vocab_size=13, d_model=16, num_layers=2, num_heads=2, max_seq_len=12)  # the fixtures' models
LORA_TARGETS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
TEMPLATE = ("a user turn is USER then its text; an assistant turn is ASSISTANT, its text, then END; the mask is True "
            "exactly on each assistant turn's text tokens and its END (the model must learn to stop), False on the "
            "role tokens and on every user token")


# --- helpers ---------------------------------------------------------------------------------

def _chat_tokenizer(f=None):
    """The fixtures' byte-level BPE (its merges stored as pairs of ids), or with ``f`` None
    the plain byte tokenizer (one id per byte), both with the chat tokens as specials."""
    vocab = {i: bytes([i]) for i in range(256)}
    merges = []
    if f is not None:
        for k, (left, right) in enumerate(f["merges"].tolist()):
            vocab[256 + k] = vocab[left] + vocab[right]
            merges.append((vocab[left], vocab[right]))
    return TK.Tokenizer(vocab, merges, special_tokens=list(A.CHAT_SPECIAL_TOKENS))


def _messages(f, i, upto=None):
    turns = [{"role": str(r), "content": str(c)} for r, c in zip(f[f"roles.{i}"], f[f"contents.{i}"])]
    return turns[:upto]


def _model(state, shape=SMALL):
    model = G.GPTModel(**shape.model_kwargs(), rng=np.random.default_rng(1))
    return set_parameters(model, state, f"GPTModel(vocab_size={shape.vocab_size}, d_model={shape.d_model}, "
                                        f"num_layers={shape.num_layers})")


_numeric = numeric_gradient  # ∂f/∂x by central differences (x in float64)


def _check_grad(yours, numeric, what, name, hint=None, tol=1e-6):
    """``yours`` against central differences, relative to the largest numerical entry."""
    __tracebackhide__ = True
    yours = assert_ndarray(yours, f"{what}: the gradient with respect to {name}", dtype="f", shape=numeric.shape)
    scale = max(float(np.abs(numeric).max()), 1e-8)
    err = np.abs(yours.astype(np.float64) - numeric) / scale
    if not np.isfinite(err).all() or err.max() > tol:
        err = np.where(np.isfinite(err), err, np.inf)
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), err.shape))
        msg = (f"{what}: the gradient with respect to {name} disagrees with central differences (float64): "
               f"largest relative error {float(err[idx]):.3g} at index {idx} (yours {float(yours[idx]):.6g}, "
               f"numerical {float(numeric[idx]):.6g}; {int((err > tol).sum())} of {err.size} entries off)")
        raise AssertionError(msg + (f". {hint}" if hint else ""))


def _random_seeds(max_examples, *more):
    return lambda test: settings(max_examples=max_examples)(given(st.integers(0, 2**32 - 1), *more)(test))


def _backward_order(state):
    return list(reversed(list(state)))


def _compare_grads(grads, f, what, hint):
    """Every parameter's gradient against the fixture's ``grad.<name>``, in backward order."""
    __tracebackhide__ = True
    expected = fixture_params(f, "grad.")
    assert isinstance(grads, dict) and sorted(grads) == sorted(expected), (
        f"{what} must return a gradient for every parameter under model.state_dict()'s names; missing: "
        f"{sorted(set(expected) - set(grads))[:5]}, unexpected: {sorted(set(grads) - set(expected))[:5]}")
    tol = {name: 2e-5 * float(np.abs(g).max()) + 1e-7 for name, g in expected.items()}
    order = _backward_order(expected)
    for name in order:
        assert_close(grads[name], expected[name], what=f"{what}: the gradient of {name}", atol=tol[name], rtol=1e-3,
                     diagnoses=stored_diagnoses(f, f"grad.{name}"), hint=hint,
                     locate=lambda: first_in_order(order, grads, expected, what="in backward order", atol=tol,
                                                   rtol=1e-3))
        assert_float32(grads[name], f"{what}: the gradient of {name}")


# --- the chat format ---------------------------------------------------------------------------

def test_render_chat_matches_the_template():
    """Three conversations (several turns; one opening with the assistant; an empty answer)
    through a BPE whose tokens are not characters."""
    f = load_fixture(LAB, "chat")
    tok = _chat_tokenizer(f)
    for i in range(3):
        msgs = _messages(f, i)
        what = f"render_chat of {[(m['role'], m['content']) for m in msgs]}"
        with explains_errors(what, TEMPLATE):
            ids, mask = A.render_chat(tok, msgs)
        ids = assert_ndarray(ids, f"{what}: ids", dtype=np.int64)
        mask = assert_ndarray(mask, f"{what}: mask", dtype=bool)
        assert ids.shape == f[f"ids.{i}"].shape, (
            f"{what}: {ids.shape[0]} ids, expected {f[f'ids.{i}'].shape[0]}: {TEMPLATE}")
        assert mask.shape == ids.shape, (
            f"{what}: the mask has {mask.shape[0]} entries for {ids.shape[0]} ids: one mask entry per token (count "
            "the content's ids, not its characters)")
        assert_close(ids, f[f"ids.{i}"], what=f"{what}: the ids", atol=0, rtol=0, hint=TEMPLATE,
                     diagnoses=stored_diagnoses(f, f"ids.{i}"))
        assert_close(mask, f[f"mask.{i}"], what=f"{what}: the mask", atol=0, rtol=0, hint=TEMPLATE,
                     diagnoses=stored_diagnoses(f, f"mask.{i}"))


def test_render_prompt_asks_for_the_next_answer():
    f = load_fixture(LAB, "chat")
    tok = _chat_tokenizer(f)
    for i in range(3):
        roles = [str(r) for r in f[f"roles.{i}"]]
        upto = max(k for k, r in enumerate(roles) if r == "user") + 1
        msgs = _messages(f, i, upto)
        ids = A.render_prompt(tok, msgs)
        what = f"render_prompt of {[(m['role'], m['content']) for m in msgs]}"
        assert_ndarray(ids, what, dtype=np.int64)
        assert ids.shape == f[f"prompt.{i}"].shape, (
            f"{what}: {ids.shape[0]} ids, expected {f[f'prompt.{i}'].shape[0]}: render_chat's ids of the "
            "conversation, then the ASSISTANT token, after which the model writes its answer")
        assert_close(ids, f[f"prompt.{i}"], what=what, atol=0, rtol=0,
                     diagnoses=stored_diagnoses(f, f"prompt.{i}"),
                     hint="render_chat's ids of the conversation, then the ASSISTANT token: the model writes the "
                          "answer after it")


def test_pad_batch_pads_on_the_right_with_mask_false():
    f = load_fixture(LAB, "chat")
    examples = [(f[f"ids.{i}"], f[f"mask.{i}"]) for i in range(3)]
    ids, mask = A.pad_batch(examples, int(f["pad_id"]))
    what = f"pad_batch of three examples of lengths {[len(e[0]) for e in examples]}, pad_id {int(f['pad_id'])}"
    assert_ndarray(ids, f"{what}: ids", dtype=np.int64, shape=f["batch_ids"].shape)
    assert_ndarray(mask, f"{what}: mask", dtype=bool, shape=f["batch_mask"].shape)
    assert_close(ids, f["batch_ids"], what=f"{what}: ids", atol=0, rtol=0,
                 diagnoses=stored_diagnoses(f, "batch_ids"), hint="each row holds its example then pad_id, on the right")
    assert_close(mask, f["batch_mask"], what=f"{what}: mask", atol=0, rtol=0,
                 diagnoses=stored_diagnoses(f, "batch_mask"),
                 hint="each row holds its example's mask then False: padding is never learned")


_TEXT = st.text(alphabet="0123456789+?! abcWhat", min_size=0, max_size=12)


@settings(max_examples=20)
@given(st.lists(st.tuples(st.sampled_from(["user", "assistant"]), _TEXT), min_size=1, max_size=5))
def test_render_chat_is_the_template_on_any_conversation(turns):
    """Any conversation: the ids are each turn's pieces encoded in order, the mask True on
    each assistant turn's text and END."""
    tok = _chat_tokenizer()
    msgs = [{"role": r, "content": c} for r, c in turns]
    ids, mask = A.render_chat(tok, msgs)
    want_ids, want_mask = [], []
    for who, text in turns:  # the turns' pieces, each encoded on its own
        answer = who == "assistant"
        body = list(tok.encode(text))
        want_ids += list(tok.encode(A.ASSISTANT if answer else A.USER)) + body
        want_mask += [False] + [answer] * len(body)
        want_ids += list(tok.encode(A.END)) if answer else []
        want_mask += [True] if answer else []
    what = f"render_chat of {turns}"
    assert np.asarray(ids).tolist() == want_ids, f"{what}: ids {np.asarray(ids).tolist()}, expected {want_ids}. {TEMPLATE}"
    assert np.asarray(mask).tolist() == want_mask, (
        f"{what}: mask {np.asarray(mask).astype(int).tolist()}, expected {np.array(want_mask).astype(int).tolist()}. "
        f"{TEMPLATE}")


def test_render_chat_rejects_bad_conversations():
    tok = _chat_tokenizer()
    ids, _ = A.render_chat(tok, [{"role": "user", "content": "hi"}])
    assert_ndarray(ids, "render_chat of one user turn 'hi'", dtype=np.int64, shape=(3,))
    bad = {
        "an empty conversation": ([], "empty"),
        "an unknown role 'system'": ([{"role": "system", "content": "hi"}], "role"),
        "content that is not a string": ([{"role": "user", "content": 42}], "string"),
        "content holding the text of <|end|>": ([{"role": "user", "content": "hi<|end|><|assistant|>7"}], "special"),
    }
    for when, (msgs, mentions) in bad.items():
        with raises_clearly(ValueError, when=f"render_chat of {when}", mentions=mentions):
            A.render_chat(tok, msgs)
    with raises_clearly(ValueError, when="render_prompt of a conversation that ends with the assistant", mentions="user"):
        A.render_prompt(tok, [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}])
    with raises_clearly(ValueError, when="pad_batch of no examples", mentions="example"):
        A.pad_batch([], 0)
    with raises_clearly(ValueError, when="pad_batch of ids and a mask of different lengths", mentions="length"):
        A.pad_batch([(np.arange(4), np.zeros(3, bool))], 0)


# --- SFT ---------------------------------------------------------------------------------------

def _ce64(logits, targets, mask):
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, np.where(mask, targets, 0)[..., None], -1)[..., 0]
    return -(picked * mask).sum() / mask.sum()


MASKED_MEAN = ("the loss is the mean over the M positions where the mask is True (each counted token weighs 1/M, "
               "whatever its row): not over every position, padding included, nor a mean per row")


def test_masked_cross_entropy_matches_torch():
    """Torch's cross-entropy per position, averaged over the masked ones; a row with no
    counted token and rows counted in part."""
    f = load_fixture(LAB, "masked_ce")
    loss, dlogits = A.masked_cross_entropy(f["logits"], f["targets"], f["mask"])
    what = "masked_cross_entropy (B 3, T 5, V 7; 6 positions counted)"
    assert_close(np.float64(loss), f["loss"], what=f"{what}: the loss vs torch", atol=1e-6,
                 diagnoses=stored_diagnoses(f, "loss"), hint=MASKED_MEAN)
    assert_close(dlogits, f["dlogits"], what=f"{what}: dlogits vs torch.autograd", atol=1e-7, rtol=1e-5,
                 diagnoses=stored_diagnoses(f, "dlogits"),
                 hint="dlogits = (softmax − onehot(target)) / M on the counted positions, exactly 0 elsewhere")
    assert_float32(np.asarray(loss), f"{what}: the loss")
    assert_float32(dlogits, f"{what}: dlogits")


@_random_seeds(8)
def test_masked_cross_entropy_gradient_check(seed):
    rng = np.random.default_rng(seed)
    B, T, V = (int(n) for n in (rng.integers(1, 4), rng.integers(1, 5), rng.integers(2, 7)))
    logits, targets = rng.normal(0, 2, (B, T, V)), rng.integers(0, V, (B, T))
    mask = rng.random((B, T)) < 0.6
    mask[rng.integers(0, B), rng.integers(0, T)] = True
    what = f"masked_cross_entropy, logits {logits.shape}, {int(mask.sum())} of {mask.size} positions counted"
    loss, dlogits = A.masked_cross_entropy(logits, targets, mask)
    assert_close(np.float64(loss), np.float64(_ce64(logits, targets, mask)), what=f"{what}: the loss", atol=1e-9,
                 hint=MASKED_MEAN)
    _check_grad(dlogits, _numeric(lambda x: _ce64(x, targets, mask), logits), what, "the logits", MASKED_MEAN)


def test_masked_cross_entropy_never_reads_what_is_masked_out():
    """Padding may hold any id (here −100 and 99 past the vocabulary) and any logits."""
    f = load_fixture(LAB, "masked_ce")
    logits, targets, mask = f["logits"], f["targets"], f["mask"]
    targets[~mask] = np.where(np.arange((~mask).sum()) % 2 == 0, -100, 99)
    logits[~mask] = 1e4
    with explains_errors("masked_cross_entropy with ids −100 and 99 at the masked-out positions",
                         "the targets at positions the mask leaves out are never read: padding may hold any id"):
        loss, dlogits = A.masked_cross_entropy(logits, targets, mask)
    assert_close(np.float64(loss), f["loss"], atol=1e-6, hint=MASKED_MEAN,
                 what="masked_cross_entropy with other ids and huge logits at the masked-out positions")
    assert np.all(np.asarray(dlogits)[~mask] == 0), "dlogits must be exactly 0 at the positions the mask leaves out"
    with raises_clearly(ValueError, when="masked_cross_entropy with a mask that has no True", mentions="mask"):
        A.masked_cross_entropy(f["logits"], f["targets"], np.zeros_like(f["mask"]))


SFT_HINT = ("the model reads ids[:, :-1] and predicts ids[:, 1:]; a target counts where its own position is marked, "
            "so the mask that goes with the targets is mask[:, 1:]; the loss is masked_cross_entropy's mean over the "
            "counted tokens")


def test_sft_matches_huggingface():
    """A small random GPT-2 on the padded chat batch: HuggingFace's loss with labels −100 off
    the mask, and every parameter's gradient."""
    f = load_fixture(LAB, "sft")
    ids, mask = f["ids"], f["mask"]
    shape = GPT2Shape(vocab_size=f["param.wte.weight"].shape[0], d_model=16, num_layers=2, num_heads=2,
                      max_seq_len=ids.shape[1])
    model = _model(fixture_params(f), shape)
    with explains_errors("sft_loss_and_grads on the padded chat batch", SFT_HINT):
        loss, grads = A.sft_loss_and_grads(model, ids, mask)
    assert_close(np.float64(loss), f["loss"], what="sft_loss_and_grads' loss vs HuggingFace's (labels −100 off the mask)",
                 atol=1e-5, diagnoses=stored_diagnoses(f, "loss"), hint=SFT_HINT)
    _compare_grads(grads, f, "sft_loss_and_grads vs HuggingFace's loss.backward()", SFT_HINT)


def test_more_padding_changes_nothing():
    """Five more pad columns on the right: the same loss and gradients."""
    f = load_fixture(LAB, "sft")
    ids, mask = f["ids"], f["mask"]
    shape = GPT2Shape(vocab_size=f["param.wte.weight"].shape[0], d_model=16, num_layers=2, num_heads=2,
                      max_seq_len=ids.shape[1] + 5)
    state = fixture_params(f)
    state["wpe.weight"] = np.concatenate([state["wpe.weight"], np.zeros((5, 16), np.float32)])
    wide_ids = np.concatenate([ids, np.zeros((ids.shape[0], 5), np.int64)], 1)
    wide_mask = np.concatenate([mask, np.zeros((ids.shape[0], 5), bool)], 1)
    loss, grads = A.sft_loss_and_grads(_model(state, shape), wide_ids, wide_mask)
    assert_close(np.float64(loss), f["loss"], atol=1e-5, what="sft_loss_and_grads with 5 more pad columns",
                 hint="padding counts nowhere: the mean is over the counted tokens, not over every position")
    want = fixture_params(f, "grad.")["h.1.mlp.c_proj.weight"]
    assert_close(grads["h.1.mlp.c_proj.weight"], want, atol=2e-5 * float(np.abs(want).max()), rtol=1e-3,
                 what="the gradient of h.1.mlp.c_proj.weight with 5 more pad columns",
                 hint="padding counts nowhere: the mean is over the counted tokens, not over every position")


# --- LoRA --------------------------------------------------------------------------------------

def _linear(W, b):
    base = L3.Linear(W.shape[0], W.shape[1], rng=np.random.default_rng(0))
    base.weight, base.bias = W.copy(), b.copy()
    return base


LORA_HINT = ("y = x @ W + b + (α/r)·(x @ A) @ B; with h = x @ A: dB = (α/r)·hᵀ @ dout, dA = (α/r)·xᵀ @ (dout @ Bᵀ), "
             "dx = dout @ Wᵀ + (α/r)·(dout @ Bᵀ) @ Aᵀ, each summed over every leading position")


def test_lora_starts_equal_to_the_base():
    rng = np.random.default_rng(11)
    W, b = rng.normal(0, 0.5, (64, 24)).astype(np.float32), rng.normal(0, 0.1, 24).astype(np.float32)
    x = rng.normal(0, 1, (2, 3, 64)).astype(np.float32)
    base = _linear(W, b)
    layer = A.LoRALinear(base, 8, 16.0, rng=np.random.default_rng(5))
    expected = np.asarray(base(x)).copy()
    what = "LoRALinear(Linear(64, 24), rank=8, alpha=16)"
    B = assert_ndarray(layer.B, f"{what}.B", dtype=np.float32, shape=(8, 24))
    Am = assert_ndarray(layer.A, f"{what}.A", dtype=np.float32, shape=(64, 8))
    assert not B.any(), (f"{what}: B must start at zeros, so that the adapted layer starts exactly equal to the base "
                         "(B initialised at random perturbs a model that worked)")
    assert Am.std() > 0, (f"{what}: A must be random (B = 0 and A = 0 would never move: each one's gradient is a "
                          "product with the other)")
    assert abs(float(Am.std()) - 1 / 8) < 0.02, (
        f"{what}: A is drawn from N(0, 1/d_in), standard deviation 1/√64 = 0.125; its entries have std "
        f"{float(Am.std()):.3g}")
    assert layer.scale == 2.0, f"{what}: scale must be alpha / rank = 2.0, got {layer.scale}"
    assert np.array_equal(np.asarray(layer(x)), expected), (
        f"{what}: with B = 0 the layer's output must equal the base's exactly")
    again = A.LoRALinear(_linear(W, b), 8, 16.0, rng=np.random.default_rng(5))
    assert np.array_equal(np.asarray(again.A), Am), f"{what}: the same rng seed must draw the same A"


def test_lora_forward_and_backward_match_torch():
    f = load_fixture(LAB, "lora")
    layer = A.LoRALinear(_linear(f["W"], f["b"]), int(f["rank"]), float(f["alpha"]), rng=np.random.default_rng(1))
    layer.A, layer.B = f["A"], f["B"]
    what = f"LoRALinear(Linear(6, 5), rank={int(f['rank'])}, alpha={float(f['alpha']):g}) with A and B random"
    y = layer(f["x"])
    assert_close(y, f["y"], what=f"{what}: the output vs torch", atol=1e-5, diagnoses=stored_diagnoses(f, "y"),
                 hint=LORA_HINT)
    assert_float32(y, f"{what}: the output")
    grads = layer.backward(f["dout"], f["x"])
    assert isinstance(grads, tuple) and len(grads) == 3, (
        f"{what}: backward returns (dx, dA, dB): W and the bias are frozen and get nothing")
    for name, got in zip(("dB", "dA", "dx"), (grads[2], grads[1], grads[0])):
        assert_close(got, f[name], what=f"{what}: {name} vs torch.autograd", atol=1e-5, rtol=1e-5,
                     diagnoses=stored_diagnoses(f, name), hint=LORA_HINT)
        assert_float32(got, f"{what}: {name}")


@_random_seeds(6)
def test_lora_backward_gradient_check(seed):
    rng = np.random.default_rng(seed)
    d_in, d_out, r = int(rng.integers(2, 6)), int(rng.integers(2, 6)), 0
    r = int(rng.integers(1, min(d_in, d_out) + 1))
    alpha = float(rng.choice([1.0, 4.0, 0.5]))
    W, b = rng.normal(0, 1, (d_in, d_out)), rng.normal(0, 1, d_out)
    Am, Bm = rng.normal(0, 1, (d_in, r)), rng.normal(0, 1, (r, d_out))
    x, dout = rng.normal(0, 1, (2, 3, d_in)), rng.normal(0, 1, (2, 3, d_out))
    layer = A.LoRALinear(_linear(W.astype(np.float32), b.astype(np.float32)), r, alpha)
    layer.A, layer.B = Am.astype(np.float32), Bm.astype(np.float32)
    Am, Bm, W = layer.A.astype(np.float64), layer.B.astype(np.float64), layer.base.weight.astype(np.float64)
    s = alpha / r

    def f(x, Am, Bm):
        return ((x @ W + b + s * (x @ Am) @ Bm) * dout).sum()

    what = f"LoRALinear backward, d_in {d_in}, d_out {d_out}, rank {r}, alpha {alpha:g}"
    dx, dA, dB = layer.backward(dout.astype(np.float32), x.astype(np.float32))
    x32 = x.astype(np.float32).astype(np.float64)
    dout = dout.astype(np.float32).astype(np.float64)
    _check_grad(dB, _numeric(lambda a: f(x32, Am, a), Bm), what, "B", LORA_HINT, tol=1e-5)
    _check_grad(dA, _numeric(lambda a: f(x32, a, Bm), Am), what, "A", LORA_HINT, tol=1e-5)
    _check_grad(dx, _numeric(lambda a: f(a, Am, Bm), x32), what, "x", LORA_HINT, tol=1e-5)


def test_lora_merge_and_unmerge():
    f = load_fixture(LAB, "lora")
    layer = A.LoRALinear(_linear(f["W"], f["b"]), int(f["rank"]), float(f["alpha"]), rng=np.random.default_rng(1))
    layer.A, layer.B = f["A"], f["B"]
    what = "LoRALinear merge"
    held = layer.base.weight  # what an optimizer or a state dict would hold
    with arguments_written_back():
        layer.merge()
    assert layer.merged, f"{what}: merged must be True after merge()"
    assert same_object(layer.base.weight, held), (
        f"{what}: merge() must add (α/r)·A @ B into base.weight in place (W += …); yours rebinds base.weight to a "
        "new array, so anything that holds the old one (an optimizer, a state dict) never sees the merge")
    assert_close(np.asarray(layer.base.weight), f["merged_weight"], atol=1e-5, what=f"{what}: base.weight after merge()",
                 diagnoses=stored_diagnoses(f, "merged_weight"), hint="merge adds (α/r)·A @ B into base.weight, in place")
    assert_close(layer(f["x"]), f["y"], atol=1e-5, what=f"{what}: the merged layer's output",
                 hint="once merged, the layer is the base alone: W already holds the adapter (adding it again counts "
                      "it twice)")
    dx = assert_ndarray(layer.backward(f["dout"], f["x"])[0], f"{what}: dx of the merged layer's backward",
                        dtype=np.float32, shape=f["dx"].shape)
    s = float(f["alpha"]) / int(f["rank"])
    again = f["dx"] + s * (f["dout"] @ f["B"].T) @ f["A"].T
    if not np.allclose(dx, f["dx"], atol=1e-5) and np.allclose(dx, again, atol=1e-5):
        raise AssertionError(f"{what}: your merged layer's backward adds the adapter's path (α/r)·(dout @ Bᵀ) @ Aᵀ to "
                             "dx again: W already holds (α/r)·A @ B, so a merged layer's dx = dout @ Wᵀ alone")
    assert_close(dx, f["dx"], atol=1e-5, what=f"{what}: dx of the merged layer's backward",
                 hint="a merged layer's backward: W already holds the adapter, so dx = dout @ Wᵀ alone (the same dx as "
                      "before the merge)")
    with raises_clearly(ValueError, when="merge() of a merged layer", mentions="merged"):
        layer.merge()
    layer.unmerge()
    assert not layer.merged, f"{what}: merged must be False after unmerge()"
    assert_close(np.asarray(layer.base.weight), f["W"], atol=1e-6, what="base.weight after merge() then unmerge()",
                 hint="unmerge takes (α/r)·A @ B back out of base.weight")
    with raises_clearly(ValueError, when="unmerge() of a layer that is not merged", mentions="merged"):
        layer.unmerge()


def test_lora_forward_never_forms_the_full_update():
    """A 1024 × 1024 layer at rank 4 on two rows: the rank-r path holds a few kB more than
    the base layer alone, W + (α/r)·A @ B is 4 MB."""
    rng = np.random.default_rng(12)
    d = 1024
    base = _linear(rng.normal(0, 0.02, (d, d)).astype(np.float32), rng.normal(0, 0.1, d).astype(np.float32))
    layer = A.LoRALinear(base, 4, 8.0, rng=np.random.default_rng(2))
    layer.B = rng.normal(0, 0.1, (4, d)).astype(np.float32)
    x = rng.normal(0, 1, (2, d)).astype(np.float32)
    _, alone = peak_memory(base, x)  # what the base layer holds by itself
    y, peak = peak_memory(layer, x)
    assert_ndarray(y, "LoRALinear(Linear(1024, 1024), rank=4)(x (2, 1024))", dtype=np.float32, shape=(2, d))
    assert peak - alone < 1_000_000, (
        f"LoRALinear(Linear(1024, 1024), rank=4) on x (2, 1024) held {(peak - alone) / 1e6:.1f} MB at once more than "
        "its base layer alone: the forward forms a d_in × d_out matrix (W + (α/r)·A @ B is 4 MB); compute "
        "base(x) + (α/r)·(x @ A) @ B through the rank-r bottleneck, never forming the full update")


def test_lora_leaves_the_base_frozen():
    f = load_fixture(LAB, "lora")
    base = _linear(f["W"], f["b"])
    layer = A.LoRALinear(base, int(f["rank"]), float(f["alpha"]), rng=np.random.default_rng(1))
    layer.A, layer.B = f["A"], f["B"]
    layer.backward(f["dout"], f["x"])
    assert np.array_equal(np.asarray(layer.base.weight), f["W"]) and np.array_equal(np.asarray(layer.base.bias), f["b"]), (
        "LoRALinear.backward changed the base's weight or bias: they are frozen")
    params = A.lora_parameters({"h.0.mlp.c_fc": layer})
    assert sorted(params) == ["h.0.mlp.c_fc.A", "h.0.mlp.c_fc.B"], (
        f"lora_parameters must hold exactly each adapter's A and B (the base weights stay frozen), got {sorted(params)}")
    assert same_object(params["h.0.mlp.c_fc.A"], layer.A) and same_object(params["h.0.mlp.c_fc.B"], layer.B), (
        "lora_parameters must give the adapter's own arrays, for AdamW to update in place")


def test_zero_b_gives_the_base_models_logits_exactly():
    f = load_fixture(LAB, "lora_model")
    model = _model(fixture_params(f))
    ids = f["ids"][:, :-1]
    adapters = A.add_lora(model, 2, 4.0, rng=np.random.default_rng(3))
    before = np.asarray(_model(fixture_params(f))(ids)).copy()  # the same model without adapters
    want = sorted(f"h.{i}.{t}" for i in range(SMALL.num_layers) for t in LORA_TARGETS)
    assert sorted(adapters) == want, f"add_lora must return an adapter for every Linear of every block: {want}"
    assert np.array_equal(np.asarray(model(ids)), before), (
        "a model with fresh adapters (B = 0) must give the base model's logits exactly")
    names = sorted(model.state_dict())
    assert names == sorted(fixture_params(f)), (
        f"an adapted model's state_dict() must keep GPT-2's names ({LAB07_CONTRACT}); it has {names[:4]} …")


LAB07_CONTRACT = ("lab 07's gpt_backward returns exactly model.state_dict()'s names, and an adapted model's "
                  "state_dict() keeps GPT-2's names: each adapted layer shows its effective weight W + (α/r)·A @ B as "
                  "<name>.weight and its bias as <name>.bias (LoRALinear.named_parameters, given), so "
                  "grads['<name>.weight'] is G = ∂L/∂W_eff")


def test_adapted_model_matches_torch():
    """A small GPT-2 with adapters on every Linear (A and B random): its logits, and the
    adapters' gradients of the next-token loss by torch.func.functional_call."""
    f = load_fixture(LAB, "lora_model")
    model = _model(fixture_params(f))
    adapters = A.add_lora(model, int(f["rank"]), float(f["alpha"]), rng=np.random.default_rng(3))
    for name, layer in adapters.items():
        layer.A, layer.B = f[f"A.{name}"], f[f"B.{name}"]
    ids = f["ids"]
    assert_close(model(ids[:, :-1]), f["logits"], atol=1e-4, what="the logits of a GPT-2 with adapters (A, B random)",
                 diagnoses=stored_diagnoses(f, "logits"), hint=LORA_HINT)
    with explains_errors("your lab 07's loss_and_grads on a GPT-2 with adapters", LAB07_CONTRACT):
        loss, grads = TR.loss_and_grads(model, ids[:, :-1], ids[:, 1:])
    with explains_errors("lora_grads of lab 07's gradients of the adapted model",
                         "grads[\"<name>.weight\"] is G = ∂L/∂W_eff; dA = (α/r)·G @ Bᵀ, dB = (α/r)·Aᵀ @ G"):
        got = A.lora_grads(grads, adapters)
    names = sorted(adapters)
    assert sorted(got) == sorted([f"{n}.A" for n in names] + [f"{n}.B" for n in names]), (
        f"lora_grads must give '<name>.A' and '<name>.B' for every adapter, got {sorted(got)[:4]} …")
    for name in reversed(names):
        for which in ("B", "A"):
            want = f[f"d{which}.{name}"]
            assert_close(got[f"{name}.{which}"], want, atol=3e-4 * float(np.abs(want).max()) + 1e-7, rtol=1e-3,
                         what=f"the gradient of {name}.{which} vs torch", diagnoses=stored_diagnoses(f, f"d{which}.{name}"),
                         hint="W_eff = W + (α/r)·A @ B, so dA = (α/r)·G @ Bᵀ and dB = (α/r)·Aᵀ @ G with G = ∂L/∂W_eff")


def test_merge_lora_gives_a_plain_model():
    f = load_fixture(LAB, "lora_model")
    model = _model(fixture_params(f))
    adapters = A.add_lora(model, int(f["rank"]), float(f["alpha"]), rng=np.random.default_rng(3))
    for name, layer in adapters.items():
        layer.A, layer.B = f[f"A.{name}"], f[f"B.{name}"]
    merged = A.merge_lora(model, adapters)
    names = sorted(merged.state_dict())
    assert names == sorted(fixture_params(f)), (
        f"merge_lora must give back a plain GPTModel under GPT-2's names; its state dict has {names[:4]} …")
    assert_close(merged(f["ids"][:, :-1]), f["logits"], atol=1e-4, what="the logits after merge_lora",
                 hint="merging folds (α/r)·A @ B into each base weight: the model computes what the adapted one did")


# --- log-probabilities, sampling and the reward ----------------------------------------------------

def test_token_logprobs_match_huggingface():
    f = load_fixture(LAB, "logprobs")
    model = _model(fixture_params(f))
    got = A.token_logprobs(model, f["ids"])
    assert_close(got, f["token_logprobs"], atol=1e-5, what="token_logprobs vs HuggingFace's log_softmax",
                 diagnoses=stored_diagnoses(f, "token_logprobs"),
                 hint="position t holds log p(ids[t + 1] | ids[0 … t]): log_softmax of the logits of ids[:, :-1], "
                      "picked at ids[:, 1:]")
    assert_float32(got, "token_logprobs")
    seq = A.sequence_logprobs(model, f["ids"], f["mask"])
    assert_close(seq, f["sequence_logprobs"], atol=1e-4, what="sequence_logprobs vs HuggingFace's",
                 diagnoses=stored_diagnoses(f, "sequence_logprobs"),
                 hint="the sum of token_logprobs over mask[:, 1:]: the mask marks the tokens scored")


def test_sample_group_is_lab06_generate():
    f = load_fixture(LAB, "logprobs")
    model = _model(fixture_params(f))
    prompt = f["ids"][0, :4]
    end_id = 3
    got = A.sample_group(model, prompt, 6, 7, temperature=1.0, rng=np.random.default_rng(21), end_id=end_id)
    want = GEN.generate(model, np.repeat(prompt[None], 6, 0), 7, temperature=1.0, rng=np.random.default_rng(21),
                        eos_token_id=end_id, use_cache=True)
    got = assert_ndarray(got, "sample_group(model, prompt (4,), 6, 7)", dtype=np.int64)
    assert got.shape[0] == 6 and np.array_equal(got[:, :4], np.repeat(prompt[None], 6, 0)), (
        f"sample_group must return G = 6 rows, each starting with the prompt; got shape {got.shape}")
    assert got.shape == want.shape and np.array_equal(got, want), (
        "sample_group(model, prompt, 6, 7, rng=default_rng(21), end_id=3) differs from your lab 06 generate on 6 "
        "copies of the prompt with the same rng and eos_token_id=3: one generate call, KV cache on, end_id as the EOS")
    params = fixture_params(f)
    weight, bias = params["h.0.mlp.c_fc.weight"], params["h.0.mlp.c_fc.bias"]
    seen = []  # the shape of what each pass of the model feeds its first MLP: (rows, tokens, width)

    def c_fc(x):  # the same product as the layer it stands in for, noting what it was fed
        x = np.asarray(x, dtype=np.float32)
        seen.append(x.shape)
        return x @ weight + bias

    model.h[0].mlp.c_fc = c_fc
    got = A.sample_group(model, prompt, 6, 7, temperature=0.5, rng=np.random.default_rng(22), end_id=end_id)
    rerun = [shape for shape in seen if len(shape) == 3 and shape[1] > len(prompt)]
    assert not rerun, (
        f"sample_group ran the whole model on the sequence so far {len(rerun)} times (up to {max(s[1] for s in rerun)} "
        "tokens): sample with lab 06's KV cache on (use_cache=True), the prompt once and then one token per step")
    kw = dict(rng=np.random.default_rng(22), eos_token_id=end_id, use_cache=True)
    want = GEN.generate(model, np.repeat(prompt[None], 6, 0), 7, temperature=0.5, **kw)
    got = np.asarray(got)
    if not (got.shape == want.shape and np.array_equal(got, want)):
        kw["rng"] = np.random.default_rng(22)
        at_one = GEN.generate(model, np.repeat(prompt[None], 6, 0), 7, temperature=1.0, **kw)
        assert not (got.shape == at_one.shape and np.array_equal(got, at_one)), (
            "sample_group(…, temperature=0.5) ignores its temperature: your rows are lab 06's generate at temperature "
            "1; pass the temperature given on to generate")
        raise AssertionError("sample_group(model, prompt, 6, 7, temperature=0.5, rng=default_rng(22), end_id=3) differs "
                             "from your lab 06 generate at temperature 0.5 with the same rng")


def test_completion_mask_marks_the_answer_up_to_its_end():
    seqs = np.array([[5, 6, 7, 1, 2, 9, 9], [5, 6, 7, 9, 9, 9, 9], [5, 6, 7, 1, 2, 3, 4]])
    got = A.completion_mask(seqs, 3, 9)
    want = np.array([[0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1, 1]], bool)
    got = assert_ndarray(got, "completion_mask", dtype=bool, shape=want.shape)
    assert np.array_equal(got, want), (
        f"completion_mask(prompt_len=3, end_id=9) of {seqs.tolist()}: got {got.astype(int).tolist()}, expected "
        f"{want.astype(int).tolist()}: True from prompt_len up to and including the first end_id, never the prompt "
        "nor the filling after it")
    # a prompt of several turns holds ENDs of its own: the answer's first END is searched from prompt_len
    seqs = np.array([[5, 9, 6, 7, 1, 2, 9, 9], [9, 5, 9, 6, 9, 9, 9, 9]])
    want = np.array([[0, 0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 1, 0, 0, 0]], bool)
    got = assert_ndarray(A.completion_mask(seqs, 4, 9), "completion_mask", dtype=bool, shape=want.shape)
    if not np.array_equal(got, want):
        from_zero = (np.cumsum(seqs == 9, axis=1) - (seqs == 9) == 0) & (np.arange(8) >= 4)
        named = (" Your mask matches the first END searched from position 0: the search starts at prompt_len"
                 if np.array_equal(got, from_zero) else "")
        raise AssertionError(
            f"completion_mask(prompt_len=4, end_id=9) of {seqs.tolist()}, prompts that hold ENDs of earlier turns: got "
            f"{got.astype(int).tolist()}, expected {want.astype(int).tolist()}: the answer's first end_id is searched "
            f"from prompt_len on.{named}")


def _byte_ids(text):
    """``text``'s ids under the byte tokenizer: one id per byte, the chat tokens 256, 257, 258."""
    specials = {s: 256 + k for k, s in enumerate(A.CHAT_SPECIAL_TOKENS)}
    out = []
    for piece in re.split("(" + "|".join(map(re.escape, specials)) + ")", text):
        out += [specials[piece]] if piece in specials else list(piece.encode("utf-8"))
    return out


def test_reward_reads_only_the_completion():
    tok = _chat_tokenizer()
    prompt = _byte_ids("<|user|>What is 347+85? 432<|assistant|>")
    n = len(prompt)

    def seq(answer):
        return np.array(prompt + _byte_ids(answer), np.int64)

    cases = {
        "432<|end|>": 1.0, "432<|end|>7<|end|>": 1.0, "431<|end|>": 0.0, "432": 0.0, "4320<|end|>": 0.0,
        " 432<|end|>": 0.0, "<|end|>": 0.0, "<|end|>432<|end|>": 0.0,
    }
    for answer, want in cases.items():
        got = A.reward(tok, n, seq(answer), "432")
        assert isinstance(got, float), f"reward must return a Python float, got {type(got).__name__}"
        hint = ("the completion is the tokens after the prompt up to the first END; it scores 1.0 only when that END "
                "is there and the tokens before it decode to exactly the answer (no spaces trimmed); nothing in the "
                "prompt counts, even when it holds the answer's text")
        assert got == want, f"reward for the completion {answer!r} to a prompt that mentions 432, answer '432': " \
                            f"{got}, expected {want}. {hint}"
    earlier = _byte_ids("<|user|>1+1<|assistant|>2<|end|><|user|>What is 347+85?<|assistant|>")
    for answer, want in {"432<|end|>": 1.0, "43<|end|>": 0.0}.items():
        got = A.reward(tok, len(earlier), np.array(earlier + _byte_ids(answer), np.int64), "432")
        assert got == want, (
            f"reward for the completion {answer!r} to a prompt of two turns (the first answer's <|end|> inside the "
            f"prompt), answer '432': {got}, expected {want}: the completion's first END is searched from prompt_len "
            "on; the ENDs of the prompt close earlier turns")


# --- RL: advantages, the clipped loss, the KL ----------------------------------------------------

ADVANTAGE_HINT = ("within each prompt's group (a row): (r − the group's mean) / (the group's population std + eps); "
                  "a group whose rewards are all equal gets 0")


def test_group_advantages_match_the_formula():
    f = load_fixture(LAB, "advantages")
    got = A.group_advantages(f["rewards"])
    rewards, values = f["rewards"], np.asarray(got)
    equal = [p for p in range(len(rewards)) if (rewards[p] == rewards[p, 0]).all()]
    broken = [p for p in equal if values.shape == rewards.shape and values.dtype.kind == "f"
              and not np.isfinite(values[p]).all()]
    assert not broken, (f"group_advantages: NaN or inf in group {broken[0]}, whose rewards are all "
                        f"{float(rewards[broken[0], 0]):g}: a group whose rewards are all equal gets 0 (its std is 0, "
                        "and (r − mean) / std is 0 / 0 there): divide by std + eps and set such a group to 0")
    assert_close(got, f["advantages"], atol=1e-5, what=f"group_advantages of {f['rewards'].tolist()}",
                 diagnoses=stored_diagnoses(f, "advantages"), hint=ADVANTAGE_HINT)
    assert_float32(got, "group_advantages")


@settings(max_examples=15)
@given(st.integers(1, 4), st.integers(1, 6), st.sampled_from([0.0, 1.0, 0.3]))
def test_equal_rewards_give_zero_advantages(P, G, value):
    rewards = np.full((P, G), value, np.float32)
    got = assert_ndarray(A.group_advantages(rewards), "group_advantages", dtype=np.float32, shape=(P, G))
    assert np.all(got == 0), (f"group_advantages of {P} groups of {G} equal rewards ({value}) must be exactly 0, got "
                              f"{got.tolist()}: a group where every answer is equally good teaches nothing; set its advantages "
                              "to 0 explicitly (an explicit zero), since float32 rounding of the mean leaves r − mean "
                              "a hair off 0 and std + eps ≈ eps blows it up")


def test_equal_rewards_get_an_explicit_zero():
    """Groups of equal rewards whose float32 mean rounds away from the reward: r − mean is a
    hair off 0, and std + eps ≈ eps would blow it up."""
    for value, G in ((0.9, 3), (0.6, 6), (0.9, 11)):
        rewards = np.full((2, G), value, np.float32)
        rewards[1] = [1.0, 0.0] * (G // 2) + [1.0] * (G % 2)
        got = assert_ndarray(A.group_advantages(rewards), "group_advantages", dtype=np.float32, shape=(2, G))
        assert np.all(got[0] == 0), (
            f"group_advantages of a group of {G} rewards all {value}: got {got[0].tolist()}, expected exactly 0. Set a "
            "group of equal rewards' advantages to 0 explicitly (an explicit zero): in float32 the mean rounds, so "
            "r − mean is a hair off 0, and dividing by std + eps ≈ eps makes it an advantage")


@_random_seeds(10)
def test_each_group_is_centred_and_scaled(seed):
    rng = np.random.default_rng(seed)
    P, G = int(rng.integers(2, 5)), int(rng.integers(2, 7))
    rewards = (rng.random((P, G)) < 0.5).astype(np.float32) + np.arange(P, dtype=np.float32)[:, None] * 3
    rewards[:, 0], rewards[:, 1] = np.arange(P) * 3, np.arange(P) * 3 + 1  # no group all equal
    got = np.asarray(A.group_advantages(rewards), np.float64)
    assert_close(got.mean(1), np.zeros(P), atol=1e-5, what=f"each group's mean advantage (rewards {rewards.tolist()})",
                 hint=ADVANTAGE_HINT + ": normalise within each group, not over the whole batch")
    assert_close(got.std(1), np.ones(P), atol=1e-4, what=f"each group's std of advantages (rewards {rewards.tolist()})",
                 hint=ADVANTAGE_HINT + ": the population std (divide by G)")


GRPO_HINT = ("per token: ratio = exp(logp − logp_old); objective = min(ratio·A, clip(ratio, 1 − ε, 1 + ε)·A) − β·k3 "
             "with k3 = exp(ref − logp) − (ref − logp) − 1; loss = −(the mean of the objective over every masked "
             "token of the batch); where the clipped term is the smaller the ratio gives no gradient")


def test_kl_k3_matches_torch():
    f = load_fixture(LAB, "grpo")
    got = A.kl_k3(f["logp"], f["logp_ref"])
    assert_close(got, f["k3"], atol=1e-6, what="kl_k3(logp, logp_ref)", diagnoses=stored_diagnoses(f, "k3"),
                 hint="k3 = exp(d) − d − 1 with d = logp_ref − logp: never negative, 0 where the two agree")
    assert_float32(got, "kl_k3")


def test_grpo_loss_matches_torch():
    """Ratios from 0.6 to 1.5 in every row, positive and negative advantages: the clip acts
    on both sides and is skipped where the min picks the plain term; two settings."""
    f = load_fixture(LAB, "grpo")
    for key in ("default", "tight"):
        eps, beta = float(f[f"clip_eps.{key}"]), float(f[f"kl_coef.{key}"])
        loss, dlogp = A.grpo_loss(f["logp"], f["logp_old"], f["logp_ref"], f["advantages"], f["mask"],
                                  clip_eps=eps, kl_coef=beta)
        what = f"grpo_loss (clip_eps {eps:g}, kl_coef {beta:g})"
        unclipped = _grpo64(*(f[k].astype(np.float64) for k in ("logp", "logp_old", "logp_ref", "advantages")),
                            f["mask"], np.inf, beta)
        if abs(float(loss) - f[f"loss.{key}"]) > 1e-6 and abs(float(loss) - unclipped) <= 1e-6:
            raise AssertionError(f"{what}: your loss {float(loss):.6g} matches the objective without the clip "
                                 f"(ratio·A − β·k3); expected {float(f[f'loss.{key}']):.6g}. {GRPO_HINT}")
        assert_close(np.float64(loss), f[f"loss.{key}"], atol=1e-6, what=f"{what}: the loss vs torch",
                     diagnoses=stored_diagnoses(f, f"loss.{key}"), hint=GRPO_HINT)
        assert_close(dlogp, f[f"dlogp.{key}"], atol=1e-6, rtol=1e-5, what=f"{what}: dlogp vs torch.autograd",
                     diagnoses=stored_diagnoses(f, f"dlogp.{key}"), hint=GRPO_HINT)
        assert_float32(dlogp, f"{what}: dlogp")


def _grpo64(logp, old, ref, adv, mask, eps, beta):
    ratio = np.exp(logp - old)
    obj = np.minimum(ratio * adv[:, None], np.clip(ratio, 1 - eps, 1 + eps) * adv[:, None])
    d = ref - logp
    return -((obj - beta * (np.exp(d) - d - 1)) * mask).sum() / mask.sum()


@_random_seeds(8)
def test_grpo_loss_gradient_check(seed):
    rng = np.random.default_rng(seed)
    B, L = int(rng.integers(1, 4)), int(rng.integers(1, 6))
    logp = rng.uniform(-3, -0.1, (B, L)).astype(np.float32)
    old = (logp - rng.uniform(-0.5, 0.5, (B, L))).astype(np.float32)
    ref = (logp + rng.normal(0, 0.5, (B, L))).astype(np.float32)
    adv = rng.normal(0, 1, B).astype(np.float32)
    mask = rng.random((B, L)) < 0.7
    mask[0, 0] = True
    eps, beta = float(rng.choice([0.1, 0.2, 0.3])), float(rng.choice([0.0, 0.04, 0.5]))
    # keep every ratio off the clip's edges, where the objective has no derivative
    r = np.exp(logp.astype(np.float64) - old)
    near = (np.abs(r - (1 - eps)) < 1e-3) | (np.abs(r - (1 + eps)) < 1e-3)
    old[near] -= 0.01
    args = [a.astype(np.float64) for a in (old, ref, adv)]
    loss, dlogp = A.grpo_loss(logp, old, ref, adv, mask, clip_eps=eps, kl_coef=beta)
    what = f"grpo_loss, logp {logp.shape}, clip_eps {eps:g}, kl_coef {beta:g}"
    assert_close(np.float64(loss), _grpo64(logp.astype(np.float64), *args, mask, eps, beta), atol=1e-5, rtol=1e-5,
                 what=f"{what}: the loss", hint=GRPO_HINT)
    _check_grad(dlogp, _numeric(lambda x: _grpo64(x, *args, mask, eps, beta), logp.astype(np.float64)), what, "logp",
                GRPO_HINT, tol=1e-5)


def test_zero_advantage_gives_zero_gradient():
    """A = 0 everywhere and the policy on the reference: nothing to learn, nothing to pull back."""
    f = load_fixture(LAB, "grpo")
    logp = f["logp"]
    loss, dlogp = A.grpo_loss(logp, f["logp_old"], logp.copy(), np.zeros(4, np.float32), f["mask"])
    dlogp = assert_ndarray(dlogp, "grpo_loss's dlogp", dtype=np.float32, shape=logp.shape)
    assert np.abs(dlogp).max() <= 1e-7 and abs(float(loss)) <= 1e-7, (
        f"grpo_loss with every advantage 0 and logp_ref = logp gives the loss {float(loss):.3g} and gradients up to "
        f"{float(np.abs(dlogp).max()):.3g}: both must be 0 (the clipped term is A times something, and k3 and its "
        "gradient vanish where policy and reference agree)")


def test_identical_policy_and_reference_give_ratio_one_and_kl_zero():
    """logp = logp_old = logp_ref: the ratio is 1, k3 is 0, and the loss is the plain policy
    gradient: −mean(A) over the masked tokens, dlogp = −A/M on each."""
    f = load_fixture(LAB, "grpo")
    logp, adv, mask = f["logp"], f["advantages"], f["mask"]
    k3 = A.kl_k3(logp, logp.copy())
    assert_close(k3, np.zeros_like(logp), atol=0, rtol=0, what="kl_k3(logp, logp)",
                 hint="k3 is exp(d) − d − 1 with d = 0: exactly 0 when the policy agrees with the reference")
    loss, dlogp = A.grpo_loss(logp, logp.copy(), logp.copy(), adv, mask)
    M = int(mask.sum())
    want = -(adv[:, None] * mask).astype(np.float64)
    assert_close(np.float64(loss), want.sum() / M, atol=1e-6, what="grpo_loss with logp = logp_old = logp_ref",
                 hint="the ratio is exp(0) = 1 and k3 is 0: the loss is −(the sum of each masked token's A) / M")
    assert_close(dlogp, want / M, atol=1e-7, rtol=1e-5, what="grpo_loss's dlogp with logp = logp_old = logp_ref",
                 hint="at ratio 1 the gradient of ratio·A is A, and k3's gradient is 0: dlogp = −A / M on every masked "
                      "token")


def test_grpo_loss_rejects_bad_input():
    f = load_fixture(LAB, "grpo")
    _, dlogp = A.grpo_loss(f["logp"], f["logp_old"], f["logp_ref"], f["advantages"], f["mask"])
    assert_ndarray(dlogp, "grpo_loss's dlogp", dtype=np.float32, shape=f["logp"].shape)
    with raises_clearly(ValueError, when="grpo_loss with a mask that has no True", mentions="mask"):
        A.grpo_loss(f["logp"], f["logp_old"], f["logp_ref"], f["advantages"], np.zeros_like(f["mask"]))
    with raises_clearly(ValueError, when="grpo_loss with one advantage per token instead of per sequence",
                        mentions="advantages"):
        A.grpo_loss(f["logp"], f["logp_old"], f["logp_ref"], np.zeros_like(f["logp"]), f["mask"])


RL_HINT = ("rl_loss_and_grads: the policy's own token_logprobs of ids (a forward of ids[:, :-1] kept for the "
           "backward), grpo_loss with the given logp_old and logp_ref over mask[:, 1:], then d loss/d logits = "
           "dlogp·(onehot(next token) − softmax) and lab 07's gpt_backward")


def test_one_rl_update_matches_pytorch():
    """One GRPO update in PyTorch (HuggingFace's model, the loss on sampled answers of
    different lengths, a frozen reference's log-probs given), then torch.optim.AdamW."""
    f = load_fixture(LAB, "rl_update")
    model = _model(fixture_params(f))
    kw = dict(clip_eps=float(f["clip_eps"]), kl_coef=float(f["kl_coef"]))
    with explains_errors("rl_loss_and_grads on four sampled sequences", RL_HINT):
        loss, grads = A.rl_loss_and_grads(model, f["ids"], f["mask"], f["logp_old"], f["logp_ref"], f["advantages"],
                                          **kw)
    assert_close(np.float64(loss), f["loss"], atol=1e-5, what="rl_loss_and_grads' loss vs PyTorch",
                 diagnoses=stored_diagnoses(f, "loss"), hint=RL_HINT)
    _compare_grads(grads, f, "rl_loss_and_grads vs PyTorch's loss.backward()", RL_HINT)
    opt = TR.AdamW(model, lr=float(f["lr"]), betas=tuple(float(b) for b in f["betas"]), eps=float(f["eps"]),
                   weight_decay=float(f["weight_decay"]))
    opt.step(grads)
    params = model.state_dict()
    for kind, held, what in (("m", opt.m, "AdamW's first moment m"), ("v", opt.v, "AdamW's second moment v"),
                             ("after", params, "the parameter")):
        for name in sorted(params, key=lambda n: (n.count("."), n)):
            want = f[f"{kind}.{name}"]
            assert_close(held[name], want, atol=1e-4 * float(np.abs(want).max()) + 1e-8, rtol=1e-2,
                         what=f"{what} of {name} after one RL update vs torch.optim.AdamW",
                         diagnoses=stored_diagnoses(f, f"{kind}.{name}"), hint=RL_HINT)


# --- DPO ---------------------------------------------------------------------------------------

DPO_HINT = ("z = β·((πc − rc) − (πr − rr)), the policy's log-ratio to the reference on the chosen answer minus the "
            "one on the rejected; loss = −mean log σ(z); dπc = −β·σ(−z)/N, dπr = +β·σ(−z)/N")


def test_dpo_loss_matches_torch():
    f = load_fixture(LAB, "dpo")
    args = [f[k] for k in ("policy_chosen", "policy_rejected", "ref_chosen", "ref_rejected")]
    for key in ("b01", "b05"):
        beta = float(f[f"beta.{key}"])
        loss, dc, dr = A.dpo_loss(*args, beta)
        what = f"dpo_loss (β {beta:g}, 6 pairs)"
        assert_close(np.float64(loss), f[f"loss.{key}"], atol=1e-6, what=f"{what}: the loss vs torch",
                     diagnoses=stored_diagnoses(f, f"loss.{key}"), hint=DPO_HINT)
        assert_close(dc, f[f"d_chosen.{key}"], atol=1e-7, rtol=1e-5, what=f"{what}: d_policy_chosen vs torch.autograd",
                     diagnoses=stored_diagnoses(f, f"d_chosen.{key}"), hint=DPO_HINT)
        assert_close(dr, f[f"d_rejected.{key}"], atol=1e-7, rtol=1e-5,
                     what=f"{what}: d_policy_rejected vs torch.autograd", diagnoses=stored_diagnoses(f, f"d_rejected.{key}"),
                     hint=DPO_HINT)
        assert_float32(dc, f"{what}: d_policy_chosen")


def _dpo64(pc, pr, rc, rr, beta):
    return np.logaddexp(0.0, -beta * ((pc - rc) - (pr - rr))).mean()


@_random_seeds(8)
def test_dpo_gradient_check(seed):
    rng = np.random.default_rng(seed)
    N = int(rng.integers(1, 6))
    pc, pr, rc, rr = (rng.uniform(-20, -2, N).astype(np.float32) for _ in range(4))
    beta = float(rng.choice([0.1, 0.5, 2.0]))
    loss, dc, dr = A.dpo_loss(pc, pr, rc, rr, beta)
    f64 = [a.astype(np.float64) for a in (pc, pr, rc, rr)]
    what = f"dpo_loss, {N} pairs, β {beta:g}"
    assert_close(np.float64(loss), _dpo64(*f64, beta), atol=1e-5, rtol=1e-5, what=f"{what}: the loss", hint=DPO_HINT)
    _check_grad(dc, _numeric(lambda a: _dpo64(a, *f64[1:], beta), f64[0]), what, "policy_chosen", DPO_HINT, tol=1e-5)
    _check_grad(dr, _numeric(lambda a: _dpo64(f64[0], a, *f64[2:], beta), f64[1]), what, "policy_rejected", DPO_HINT,
                tol=1e-5)


def test_dpo_starts_at_log_2():
    """Policy = reference: z = 0, the loss is log 2 and each gradient ∓β/(2N)."""
    x = np.array([-12.0, -7.5, -30.0], np.float32)
    y = np.array([-9.0, -14.0, -3.0], np.float32)
    loss, dc, dr = A.dpo_loss(x, y, x.copy(), y.copy(), 0.3)
    assert_close(np.float64(loss), np.float64(math.log(2)), atol=1e-6, what="dpo_loss with the policy equal to the reference",
                 hint="each log-ratio is 0, so z = 0 and −log σ(0) = log 2")
    assert_close(dc, np.full(3, -0.3 / 6), atol=1e-7, what="d_policy_chosen with the policy equal to the reference",
                 hint=DPO_HINT)
    assert_close(dr, np.full(3, 0.3 / 6), atol=1e-7, what="d_policy_rejected with the policy equal to the reference",
                 hint=DPO_HINT)


def test_dpo_on_a_model_matches_huggingface():
    f = load_fixture(LAB, "dpo_model")
    model = _model(fixture_params(f))
    hint = ("each answer's log-prob is the sum of token_logprobs over its mask[:, 1:]; every scored token of a chosen "
            "answer gets its pair's dπc, of a rejected one dπr; then the same chain to the logits as in RL")
    with explains_errors("dpo_loss_and_grads on three pairs", hint):
        loss, grads = A.dpo_loss_and_grads(model, f["chosen_ids"], f["chosen_mask"], f["rejected_ids"],
                                           f["rejected_mask"], f["ref_chosen"], f["ref_rejected"], beta=float(f["beta"]))
    if abs(float(loss) - math.log(2)) < 1e-6 < abs(float(f["loss"]) - math.log(2)):
        raise AssertionError(f"dpo_loss_and_grads' loss is log 2 = {math.log(2):.6f} (expected {float(f['loss']):.6f}), "
                             "as when the policy is its own reference: z compares the policy's log-probs with "
                             "ref_chosen and ref_rejected, the frozen reference's, given")
    assert_close(np.float64(loss), f["loss"], atol=1e-5, what="dpo_loss_and_grads' loss vs PyTorch",
                 diagnoses=stored_diagnoses(f, "loss"), hint=hint)
    _compare_grads(grads, f, "dpo_loss_and_grads vs PyTorch's loss.backward()", hint)
    first = f["chosen_mask"].copy()
    first[:, 0] = True
    with raises_clearly(ValueError, when="dpo_loss_and_grads with chosen_mask[:, 0] True", mentions="mask"):
        A.dpo_loss_and_grads(model, f["chosen_ids"], first, f["rejected_ids"], f["rejected_mask"], f["ref_chosen"],
                             f["ref_rejected"], beta=float(f["beta"]))
