"""GPT-2's parameters by name and shape, as the hub's checkpoints store them (bare names;
``save_pretrained`` adds a ``transformer.`` prefix) and as ``GPTModel.state_dict()``
names them.

Shapes: V vocabulary, L positions (``max_seq_len``), D ``d_model``, F ``d_ff``.
"""

from __future__ import annotations


def _block_shapes(D: int, F: int) -> dict[str, tuple[int, ...]]:
    """One block's parameters (after ``h.<i>.``), in the checkpoint's order."""
    return {
        "ln_1.weight": (D,), "ln_1.bias": (D,),
        "attn.c_attn.weight": (D, 3 * D), "attn.c_attn.bias": (3 * D,),
        "attn.c_proj.weight": (D, D), "attn.c_proj.bias": (D,),
        "ln_2.weight": (D,), "ln_2.bias": (D,),
        "mlp.c_fc.weight": (D, F), "mlp.c_fc.bias": (F,),
        "mlp.c_proj.weight": (F, D), "mlp.c_proj.bias": (D,),
    }


def gpt2_parameter_shapes(*, vocab_size: int, d_model: int, num_layers: int, d_ff: int, max_seq_len: int,
                          num_heads: int | None = None, dropout: float | None = None,
                          layer_norm_eps: float | None = None) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in the order a GPT-2 holds them: ``wte.weight``
    (V, D), ``wpe.weight`` (L, D), block by block ``h.<i>.…``, then ``ln_f.weight`` and
    ``ln_f.bias`` (D,).

    Takes ``GPTModel``'s keyword arguments; those that change no shape (``num_heads``,
    ``dropout``, ``layer_norm_eps``) are accepted and ignored.
    """
    D = d_model
    shapes = {"wte.weight": (vocab_size, D), "wpe.weight": (max_seq_len, D)}
    block = _block_shapes(D, d_ff)
    for i in range(num_layers):
        shapes.update({f"h.{i}.{name}": shape for name, shape in block.items()})
    shapes.update({"ln_f.weight": (D,), "ln_f.bias": (D,)})
    return shapes


def gpt2_parameter_names(num_layers: int) -> list[str]:
    """Every parameter's name, in the same order, for a GPT-2 of ``num_layers`` blocks."""
    return list(gpt2_parameter_shapes(vocab_size=1, d_model=1, num_layers=num_layers, d_ff=1, max_seq_len=1))
