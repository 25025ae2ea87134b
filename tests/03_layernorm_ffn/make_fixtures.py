"""Fixtures for lab 03: every parameter random (gains and biases too), and the outputs."""

import numpy as np

NEEDS_TORCH = False


def _r(rng, *shape, std=1.0):
    return rng.normal(0, std, shape).astype(np.float32)


def build() -> dict[str, dict[str, np.ndarray]]:
    import layers as ref

    rng = np.random.default_rng(303)
    cases = {}

    lin = ref.Linear(6, 4, rng=rng)
    lin.weight, lin.bias = _r(rng, 6, 4), _r(rng, 4)
    x = _r(rng, 2, 3, 6)
    nobias = ref.Linear(6, 4, bias=False, rng=rng)
    nobias.weight = lin.weight
    cases["linear"] = {"weight": lin.weight, "bias": lin.bias, "x": x, "y": lin(x), "y_nobias": nobias(x)}

    D = 8
    ln = ref.LayerNorm(D)
    ln.weight, ln.bias = _r(rng, D) + 1, _r(rng, D)
    x = _r(rng, 2, 5, D, std=3.0) + 2.0
    tiny = _r(rng, 4, D, std=0.01)  # variance ~1e-4: where eps placement shows
    ln_eps = ref.LayerNorm(D, eps=1e-3)
    ln_eps.weight, ln_eps.bias = ln.weight, ln.bias
    cases["layernorm"] = {"weight": ln.weight, "bias": ln.bias, "x": x, "y": ln(x),
                          "tiny": tiny, "y_tiny_eps1e-3": ln_eps(tiny)}

    g = np.linspace(-4, 4, 161, dtype=np.float32)
    cases["gelu"] = {"x": g, "tanh": ref.gelu(g), "exact": ref.gelu_exact(g)}

    D, F = 6, 24
    ff = ref.FeedForward(D, F, rng=rng)
    ff.c_fc.weight, ff.c_fc.bias = _r(rng, D, F, std=0.7), _r(rng, F)
    ff.c_proj.weight, ff.c_proj.bias = _r(rng, F, D, std=0.5), _r(rng, D)
    x = _r(rng, 2, 5, D)
    cases["feedforward"] = {"c_fc.weight": ff.c_fc.weight, "c_fc.bias": ff.c_fc.bias,
                            "c_proj.weight": ff.c_proj.weight, "c_proj.bias": ff.c_proj.bias,
                            "x": x, "y": ff(x)}
    return cases
