"""Fixtures for lab 04: a random multi-head attention, block and small GPT (every
parameter random: LayerNorm gains and all biases too), their outputs, and what the
catalogue's mistakes would output instead (so a failing test can name the mistake
without the tests holding a second implementation)."""

import math

import numpy as np

from gptkit.checkpoints import GPT2Shape, random_gpt2_state

NEEDS_TORCH = False

D, H, F = 12, 3, 20  # width, heads (d_head = 4), feed-forward width
SMALL = GPT2Shape(vocab_size=40, d_model=D, num_layers=2, num_heads=H, max_seq_len=10, d_ff=F)
SQUARE = GPT2Shape(vocab_size=D, d_model=D, num_layers=1, num_heads=H, max_seq_len=8, d_ff=F)  # V = D


def _sub(state, prefix):
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def _variants(ref):
    """Subclasses of the reference layers that make one catalogued mistake each."""
    MHA, Block, GPT = ref.MultiHeadAttention, ref.TransformerBlock, ref.GPTModel

    class WrongOrder(MHA):  # the fused projection read as k, q, v
        def forward(self, x):
            k, q, v = np.split(self.c_attn(x), 3, axis=-1)
            return self.c_proj(self.merge_heads(self.attend(*map(self.split_heads, (q, k, v)))))

    class Interleaved(MHA):  # head h gets columns h, h+H, h+2H, …
        def split_heads(self, x):
            B, T, _ = x.shape
            return x.reshape(B, T, self.d_head, self.num_heads).transpose(0, 3, 1, 2)

        def merge_heads(self, x):
            B, _, T, _ = x.shape
            return x.transpose(0, 2, 3, 1).reshape(B, T, self.d_model)

    class MergeWrong(MHA):  # heads put back d_head-major
        def merge_heads(self, x):
            B, _, T, _ = x.shape
            return x.transpose(0, 2, 3, 1).reshape(B, T, self.d_model)

    def scaled(factor_of):
        class Scaled(MHA):
            def attend(self, q, k, v):
                return MHA.attend(self, q * (math.sqrt(self.d_head) * factor_of(self)), k, v)
        return Scaled

    class PostNorm(Block):
        def forward(self, x):
            x = self.ln_1(x + self.attn(x))
            return self.ln_2(x + self.mlp(x))

    class NoResidual(Block):
        def forward(self, x):
            return self.mlp(self.ln_2(self.attn(self.ln_1(x))))

    class NoFinalNorm(GPT):
        def forward(self, ids):
            x = self.wte(ids) + self.wpe(ids.shape[1])
            for block in self.h:
                x = block(x)
            return x @ self.wte.weight.T

    class PositionsOffByOne(GPT):
        def forward(self, ids):
            x = self.wte(ids) + self.wpe(ids.shape[1], offset=1)
            for block in self.h:
                x = block(x)
            return self.ln_f(x) @ self.wte.weight.T

    class NoPositions(GPT):
        def forward(self, ids):
            x = self.wte(ids)
            for block in self.h:
                x = block(x)
            return self.ln_f(x) @ self.wte.weight.T

    class TransposedHead(GPT):
        def forward(self, ids):
            x = self.wte(ids) + self.wpe(ids.shape[1])
            for block in self.h:
                x = block(x)
            return self.ln_f(x) @ self.wte.weight  # only square when V = D

    return {
        "wrong_order": WrongOrder, "interleaved": Interleaved, "merge_wrong": MergeWrong,
        "scale_d_model": scaled(lambda m: 1 / math.sqrt(m.d_model)), "no_scale": scaled(lambda m: 1.0),
        "post_norm": PostNorm, "no_residual": NoResidual, "no_ln_f": NoFinalNorm,
        "pos_off_by_one": PositionsOffByOne, "no_positions": NoPositions, "transposed_head": TransposedHead,
    }


def _model(cls, shape, state):
    m = cls(**shape.model_kwargs(), dropout=0.1, rng=np.random.default_rng(0))
    return m.load_state_dict(state).eval()


def _block_with(cls, state):
    b = cls(D, H, F, dropout=0.1, rng=np.random.default_rng(0))
    return b.load_state_dict(state).eval()


def _mha_with(cls, state):
    a = cls(D, H, dropout=0.1, rng=np.random.default_rng(0))
    return a.load_state_dict(state).eval()


def build() -> dict[str, dict[str, np.ndarray]]:
    import gpt as ref

    bad = _variants(ref)
    rng = np.random.default_rng(404)
    cases = {}

    x = rng.normal(0, 1, (2, 5, D)).astype(np.float32)
    mha = ref.MultiHeadAttention(D, H, rng=rng)
    cases["heads"] = {"x": x, "split": mha.split_heads(x),
                      "split_interleaved": bad["interleaved"].split_heads(mha, x)}

    q, k, v = (rng.normal(0, 1.5, (2, H, 7, D // H)).astype(np.float32) for _ in range(3))
    cases["attend"] = {
        "q": q, "k": k, "v": v, "out": mha.attend(q, k, v),
        "out_T3": mha.attend(q[:, :, 4:], k, v),  # the last 3 queries over all 7 keys
        "out_scale_d_model": bad["scale_d_model"].attend(mha, q, k, v),
        "out_no_scale": bad["no_scale"].attend(mha, q, k, v),
    }

    state = random_gpt2_state(SMALL, rng)
    attn_state = _sub(state, "h.0.attn.")
    x = rng.normal(0, 1, (2, 6, D)).astype(np.float32)
    case = {"x": x, **{f"param.{k}": v for k, v in attn_state.items()},
            "out": _mha_with(ref.MultiHeadAttention, attn_state)(x)}
    for name in ("wrong_order", "interleaved", "merge_wrong", "scale_d_model", "no_scale"):
        case[f"out_{name}"] = _mha_with(bad[name], attn_state)(x)
    cases["mha"] = case

    block_state = _sub(state, "h.0.")
    case = {"x": x, **{f"param.{k}": v for k, v in block_state.items()},
            "out": _block_with(ref.TransformerBlock, block_state)(x)}
    for name in ("post_norm", "no_residual"):
        case[f"out_{name}"] = _block_with(bad[name], block_state)(x)
    cases["block"] = case

    ids = rng.integers(0, SMALL.vocab_size, (2, 7))
    case = {"ids": ids, **{f"param.{k}": v for k, v in state.items()},
            "logits": _model(ref.GPTModel, SMALL, state)(ids)}
    for name in ("no_ln_f", "pos_off_by_one", "no_positions"):
        case[f"logits_{name}"] = _model(bad[name], SMALL, state)(ids)
    case["ids_full"] = rng.integers(0, SMALL.vocab_size, (1, SMALL.max_seq_len))
    case["logits_full"] = _model(ref.GPTModel, SMALL, state)(case["ids_full"])
    cases["model"] = case

    square = random_gpt2_state(SQUARE, rng)
    ids = rng.integers(0, SQUARE.vocab_size, (2, 5))
    cases["model_square"] = {"ids": ids, **{f"param.{k}": v for k, v in square.items()},
                             "logits": _model(ref.GPTModel, SQUARE, square)(ids),
                             "logits_transposed_head": _model(bad["transposed_head"], SQUARE, square)(ids)}
    return cases
