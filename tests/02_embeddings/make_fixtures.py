"""Fixtures for lab 02: embedding tables, ids, and the reference outputs."""

import numpy as np

NEEDS_TORCH = False


def build() -> dict[str, dict[str, np.ndarray]]:
    import embeddings as ref

    rng = np.random.default_rng(202)
    V, L, D = 13, 10, 6
    emb = ref.GPTEmbedding(V, L, D, rng=rng)
    emb.wte.weight = rng.normal(0, 1, (V, D)).astype(np.float32)
    emb.wpe.weight = rng.normal(0, 1, (L, D)).astype(np.float32)
    ids = rng.integers(0, V, size=(3, 7))
    return {
        "token_embedding": {"weight": emb.wte.weight, "ids": ids, "out": emb.wte(ids)},
        "positional_embedding": {"weight": emb.wpe.weight, "pos_0_4": emb.wpe(4),
                                 "pos_3_5": emb.wpe(5, offset=3)},
        "gpt_embedding": {"wte": emb.wte.weight, "wpe": emb.wpe.weight, "ids": ids,
                          "out": emb(ids), "out_offset2": emb(ids, offset=2)},
        "sinusoidal": {"pe_50_16": ref.sinusoidal_positional_encoding(50, 16),
                       "pe_7_5": ref.sinusoidal_positional_encoding(7, 5)},
    }
