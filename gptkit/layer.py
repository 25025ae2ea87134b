"""`Layer`: the base class of every layer in the kit.

A layer keeps its parameters as plain NumPy attributes (``self.weight``), its
sub-layers as attributes or lists of layers (``self.h = [Block(), ...]``), and is
called like a function (``layer(x)`` runs ``layer.forward(x)``). Parameter names are
the attribute paths, so a GPT's names are GPT-2's checkpoint names:
``h.0.attn.c_attn.weight``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from gptkit.state import state_diff


class Layer:
    """Base class: train/eval modes, parameter traversal, state dicts."""

    training: bool = False  # eval by default: dropout off unless asked for

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):  # pragma: no cover - always overridden
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    # -- modes ---------------------------------------------------------------
    def train(self, mode: bool = True) -> "Layer":
        """Set training mode here and in every sub-layer; returns self."""
        self.training = bool(mode)
        for _, child in self.named_layers():
            child.training = bool(mode)
        return self

    def eval(self) -> "Layer":
        """Evaluation mode (dropout off) here and in every sub-layer; returns self."""
        return self.train(False)

    # -- traversal -----------------------------------------------------------
    def _children(self) -> Iterator[tuple[str, "Layer"]]:
        for name, value in vars(self).items():
            if name.startswith("_"):
                continue
            if isinstance(value, Layer):
                yield name, value
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, Layer):
                        yield f"{name}.{i}", item

    def named_layers(self, prefix: str = "") -> Iterator[tuple[str, "Layer"]]:
        """Every sub-layer, depth first, as ("h.0.attn", layer)."""
        for name, child in self._children():
            path = f"{prefix}{name}"
            yield path, child
            yield from child.named_layers(path + ".")

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        """Every parameter array, as ("h.0.attn.c_attn.weight", array).

        A parameter is a public ndarray attribute; ``None`` (e.g. ``bias=False``)
        is not a parameter.
        """
        for name, value in vars(self).items():
            if not name.startswith("_") and isinstance(value, np.ndarray):
                yield f"{prefix}{name}", value
        for name, child in self._children():
            yield from child.named_parameters(f"{prefix}{name}.")

    def num_parameters(self) -> int:
        return sum(int(p.size) for _, p in self.named_parameters())

    # -- state dicts -----------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters by name (the arrays themselves, not copies)."""
        return dict(self.named_parameters())

    def load_state_dict(self, state: dict[str, np.ndarray], strict: bool = True) -> "Layer":
        """Copy arrays from ``state`` into this layer's parameters, by name.

        Shapes must match exactly. With ``strict`` (the default) the names must match
        too: the error lists what is missing, unexpected and mis-shaped all at once.
        Values are copied (as float32) into the existing arrays, so loading needs no
        memory beyond the model and the state dict.
        """
        own = self.state_dict()
        diff = state_diff(own, state)
        if not strict:
            diff = replace(diff, missing=(), unexpected=())
        if diff:
            raise ValueError(
                f"cannot load state dict into {type(self).__name__}: "
                + diff.describe(expected="model", actual="checkpoint")
            )
        for name in sorted(set(own) & set(state)):
            target = own[name]
            if target.dtype == np.float32 and target.flags.writeable:
                np.copyto(target, state[name], casting="same_kind")
            else:
                owner, attr = self._resolve(name)
                setattr(owner, attr, np.array(state[name], dtype=np.float32, copy=True))
        return self

    def _resolve(self, dotted: str) -> tuple["Layer", str]:
        *path, attr = dotted.split(".")
        node = self
        for part in path:
            node = node[int(part)] if part.isdigit() else getattr(node, part)
        return node, attr

