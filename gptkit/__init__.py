"""Helpers the kit provides to student code. Besides numpy, math and earlier labs'
modules, a student file may import these names from ``gptkit`` (``from gptkit import Layer``):

- ``Layer``: the base class of every layer (train/eval, parameters by name, state dicts);
- input checks: ``as_float_array``, ``check_ndim``, ``check_last_dim``, ``check_length``;
- initialisation: ``make_rng``, ``normal``;
- measuring: ``peak_memory`` (the most bytes a call held at once);
- state dicts: ``state_diff`` (which parameters are missing, unexpected or mis-shaped,
  as a ``StateDiff``) and GPT-2's names: ``gpt2_parameter_names``, ``gpt2_parameter_shapes``.

Nothing here contains lab answers. The rest of the package is the kit's own, not for
student code: ``gptkit.testing`` (what the tests use), ``gptkit.checkpoints`` (GPT-2
checkpoint files for the tests, the demo and the benchmarks), ``gptkit.data`` (GPT-2's
tokenizer files, which lab 10 reads from paths its tests and the commands pass, and the small
Shakespeare GPT the notebooks look inside), the commands ``gptkit.demo``, ``gptkit.train``,
``gptkit.shakespeare_model``, ``gptkit.assistant`` and ``gptkit.chat`` (with what they share,
``gptkit.command``; lab 11's task, addition posed as chat, is ``gptkit.arithmetic``), and
``gptkit.notebook`` (what the labs' ``explore.ipynb`` notebooks share).
"""

from gptkit.checks import as_float_array, check_last_dim, check_length, check_ndim
from gptkit.gpt2 import gpt2_parameter_names, gpt2_parameter_shapes
from gptkit.init import make_rng, normal
from gptkit.layer import Layer
from gptkit.memory import peak_memory
from gptkit.state import StateDiff, state_diff

__all__ = [
    "Layer",
    "StateDiff",
    "as_float_array",
    "check_last_dim",
    "check_length",
    "check_ndim",
    "gpt2_parameter_names",
    "gpt2_parameter_shapes",
    "make_rng",
    "normal",
    "peak_memory",
    "state_diff",
]
