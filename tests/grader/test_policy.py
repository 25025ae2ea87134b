"""The static review on its own: silent on ordinary Python, a note on what suggests an
attempt on the grader. It never decides a score (tests/grader/test_attacks.py grades the
attacks below with it in place; tests/grader/test_honest.py grades the honest corpus).

Pure and fast: nothing here runs student code or starts a sandbox.
"""

import importlib
import io
import re
import zipfile
from pathlib import Path

import pytest

from grader import policy
from grader.rubric import load_rubric
from grader.submission import expected_files

ROOT = Path(policy.__file__).resolve().parents[1]
RUBRIC = load_rubric()
WANTED = expected_files()


def lab_modules(lab: str) -> list[str]:
    """What grader/grade.py passes: the rubric's imports plus earlier labs' modules."""
    return RUBRIC[lab].allowed_imports + [m for name, mods in WANTED.items() if name <= lab for m in mods]


def review(source: str, lab: str = "01_causal_mask") -> list[str]:
    return [str(f) for f in policy.review_source(source, lab_modules(lab))]


HEAD = "import numpy as np\nimport math\n"


# --- ordinary Python: no note -----------------------------------------------------------------
ORDINARY = {
    "getattr/hasattr/setattr/vars": ("def f(layer):\n    if getattr(layer, 'bias', None) is not None:\n"
                                     "        setattr(layer, 'bias', layer.bias * 0)\n"
                                     "    return hasattr(layer, 'weight'), sorted(vars(layer))\n"),
    "collections": ("from collections import Counter, OrderedDict, defaultdict, deque, namedtuple\n"
                    "import collections\nPair = namedtuple('Pair', 'a b')\nC = collections.Counter('abca')\n"),
    "itertools/functools/operator": ("import itertools, functools, operator\nfrom functools import lru_cache, partial\n"
                                     "@lru_cache(maxsize=None)\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
                                     "S = functools.reduce(operator.add, itertools.chain([1], [2]))\n"),
    "copy/re/warnings/numbers/struct": ("import copy, re, warnings, numbers, struct\n"
                                        "def g(x, blob):\n    y = copy.deepcopy(x)\n"
                                        "    m = re.match(r'h\\.(\\d+)\\.attn', 'h.3.attn')\n"
                                        "    if not isinstance(y, numbers.Number):\n        warnings.warn('not a number')\n"
                                        "    return struct.unpack('<Q', blob[:8])[0], m.group(1)\n"),
    "os.path/pathlib/json/open": ("import os.path, os, json\nfrom pathlib import Path\n"
                                  "def read(d):\n    p = os.path.join(d, 'config.json')\n"
                                  "    if os.path.isdir(d) and os.listdir(d):\n        pass\n"
                                  "    with open(p, encoding='utf-8') as fh:\n        return json.load(fh), Path(d).name\n"),
    "dataclasses/enum/typing/abc": ("from dataclasses import dataclass, field\nimport enum\nfrom typing import Optional\n"
                                    "from abc import ABC, abstractmethod\nclass Act(enum.Enum):\n    RELU = 'relu'\n"
                                    "@dataclass(frozen=True)\nclass Config:\n    d: int = 8\n    names: list = field(default_factory=list)\n"
                                    "    def __post_init__(self):\n        object.__setattr__(self, 'd', int(self.d))\n"
                                    "class Base(ABC):\n    @abstractmethod\n    def __call__(self, x): ...\n"),
    "comprehensions/generators": ("def pairs(xs):\n    yield from ((a, b) for a, b in zip(xs, xs[1:]))\n"
                                  "D = {k: [v for v in range(k)] for k in range(3)}\nS = {x % 2 for x in range(5)}\n"),
    "heapq/bisect/statistics/string/time": ("import heapq, bisect, statistics, string, time, random, contextlib, sys\n"
                                            "H = heapq.nsmallest(2, [3, 1, 2])\nT = time.perf_counter()\n"
                                            "print('x', file=sys.stderr)\n"),
    "special methods a class needs": ("class Stack:\n    def __init__(self):\n        self.items = []\n"
                                      "    def __len__(self):\n        return len(self.items)\n"
                                      "    def __getitem__(self, i):\n        return self.items[i]\n"
                                      "    def __iter__(self):\n        return iter(self.items)\n"
                                      "    def __repr__(self):\n        return f'{type(self).__name__}({self.items})'\n"),
    "pickle, a recursion limit, a data file": ("import pickle, sys\nfrom pathlib import Path\n"
                                               "sys.setrecursionlimit(10_000)\nB = pickle.loads(pickle.dumps([1, 2]))\n"
                                               "D = Path(__file__).with_name('table.npz')\n"),
    "own names that shadow builtins": "def compile(x):\n    return x\nY = compile(3)\n",
    "numpy and math": (HEAD + "def f(x):\n    with np.errstate(over='ignore'):\n        return np.exp(x) + math.pi\n"
                       "R = np.random.default_rng(0).normal(size=3)\nnp.random.seed(0)\n"),
}


@pytest.mark.parametrize("label", sorted(ORDINARY))
def test_ordinary_python_gets_no_note(label):
    assert review(ORDINARY[label]) == [], label


def honest_files():
    """(label, lab, source) for every reference solution, stub and example student's lab file."""
    out = []
    for pattern, lab_of in (("solutions/*/*.py", lambda f: f.parent.name),
                            ("labs/*/src/*.py", lambda f: f.parents[1].name),
                            ("examples/submissions/alice/labs/*/src/*.py", lambda f: f.parents[1].name)):
        for f in sorted(ROOT.glob(pattern)):
            out.append((str(f.relative_to(ROOT)), lab_of(f), f.read_text(encoding="utf-8")))
    for z in sorted(ROOT.glob("examples/submissions/*.zip")):
        if z.stem in ("erin_cheats", "frank_fakes"):
            continue  # the cheats: see test_example_cheats_are_noted
        with zipfile.ZipFile(io.BytesIO(z.read_bytes())) as zf:
            for name in zf.namelist():
                m = re.search(r"labs/(\d\d_[a-z0-9_]+)/src/[a-z0-9_]+\.py$", name)
                if m:
                    out.append((f"{z.name}:{name}", m.group(1), zf.read(name).decode("utf-8")))
    return out


HONEST = honest_files()


def test_the_honest_files_were_found():
    labels = [label for label, _, _ in HONEST]
    assert sum(label.startswith("solutions/") for label in labels) == sum(len(m) for m in WANTED.values())
    assert sum("alice" in label for label in labels) >= 6
    assert any(label.startswith("carol.zip") for label in labels)


@pytest.mark.parametrize("label,lab,source", HONEST, ids=[h[0] for h in HONEST])
def test_reference_stubs_and_example_students_get_no_note(label, lab, source):
    assert review(source, lab) == [], label


# --- what suggests an attempt on the grader: a note with its line -----------------------------
SUSPECT = [
    ("import gc\nX = gc.get_objects()\n", "imports `gc`"),
    ("import gc as collector\n", "imports `gc`"),
    ("import inspect\n", "imports `inspect`"),
    ("from ctypes import CDLL\n", "imports `ctypes`"),
    ("import importlib.util\n", "imports `importlib.util`"),
    ("import subprocess\n", "imports `subprocess`"),
    ("import signal\n", "imports `signal`"),
    ("import builtins\nbuiltins.len = None\n", "imports `builtins`"),
    ("import pytest\n", "test machinery"),
    ("from gptkit.testing import fixtures\n", "test machinery"),
    ("from gptkit import checkpoints\n", "kit's own code"),
    ("import torch\n", "built in NumPy"),
    ("import scipy.special\n", "neither the standard library"),
    ("import os\nos.kill(os.getppid(), 9)\n", "os.kill"),
    ("from os import fork as f\nf()\n", "os.fork"),
    ("import os\nos.write(1, b'x')\n", "os.write"),
    ("import sys\nF = sys._getframe(1)\n", "sys._getframe"),
    ("import sys\nM = sys.modules['numpy']\n", "sys.modules"),
    ("import sys as s\ns.settrace(None)\n", "sys.settrace"),
    (HEAD + "P = np.ctypeslib.as_ctypes\n", "numpy.ctypeslib"),
    ("import numpy.testing as nt\n", "numpy.testing"),
    ("import types\nC = types.CodeType\n", "types.CodeType"),
    ("eval('1')\n", "uses `eval`"),
    ("exec('x = 1')\n", "uses `exec`"),
    ("M = __import__('os')\n", "uses `__import__`"),
    ("G = globals()\n", "uses `globals`"),
    ("def f():\n    g = (x for x in [])\n    return g.gi_frame.f_back\n", "f_back"),
    ("F = (lambda: 0).__globals__\n", "__globals__"),
    ("S = ().__class__.__base__.__subclasses__()\n", "__subclasses__"),
    ("G = getattr(len, '__self__', None) or getattr(print, '__globals__', None)\n", "`__globals__` in a string"),
    (HEAD + "A = np.ones(3)\nP = A.ctypes.data\n", ".ctypes"),
    ("T = open('../../solutions/01_causal_mask/causal_mask.py').read()\n", "path of the kit"),
    ("T = open('/proc/self/environ').read()\n", "path of the kit"),
    (HEAD + "X = np.load('tests/01_causal_mask/fixtures/softmax.npz')\n", "path of the kit"),
    ("W = open('gradebook.csv', 'w')\n", "path of the kit"),
    ("class Same:\n    def __eq__(self, other):\n        return True\n", "defines `__eq__`"),
    ("class A:\n    __array_priority__ = 1000\n    def __array_ufunc__(self, *a, **k):\n        return True\n",
     "defines `__array_ufunc__`"),
    ("class P:\n    def __getattr__(self, name):\n        return 0\n", "defines `__getattr__`"),
    (HEAD + "np.allclose = lambda *a, **k: True\n", "monkeypatching"),
    (HEAD + "del np.testing\n", "monkeypatching"),
    (HEAD + "setattr(np, 'allclose', print)\n", "monkeypatching"),
    ("import math as m\nm.isclose = lambda *a, **k: True\n", "monkeypatching"),
]


@pytest.mark.parametrize("source,words", SUSPECT, ids=[w + f"-{i}" for i, (_, w) in enumerate(SUSPECT)])
def test_what_suggests_an_attempt_is_noted_with_its_line(source, words):
    found = review(source)
    assert found, f"expected a note for:\n{source}"
    text = " | ".join(found)
    assert words in text, f"expected {words!r} in: {text}"
    assert all(re.match(r"line \d+: ", f) for f in found), found


def test_labs_own_third_party_modules_and_earlier_labs_get_no_note():
    assert review("from scipy.special import erf\n", "03_layernorm_ffn") == []
    assert review("from causal_mask import softmax\nimport layers\n", "04_gpt_model") == []
    assert review("from gpt import GPTModel\n", "03_layernorm_ffn") != []  # a later lab's module


def test_example_cheats_are_noted():
    def lab01(zipname):
        with zipfile.ZipFile(ROOT / "examples" / "submissions" / zipname) as zf:
            return zf.read(next(n for n in zf.namelist() if n.endswith("src/causal_mask.py"))).decode()
    assert "path of the kit" in " ".join(review(lab01("erin_cheats.zip")))
    text = " ".join(review(lab01("frank_fakes.zip")))
    assert "__eq__" in text and "monkeypatching" in text


@pytest.mark.parametrize("table", ["REVIEW_ATTRS"])
def test_every_listed_attribute_names_something_real(table):
    """The lists hold no typos: each module attribute exists in some supported version (a
    name this Python or NumPy has dropped is allowed only where listed here)."""
    gone = {"sys.remote_exec", "sys._current_exceptions", "numpy.core", "numpy.distutils", "os.plock", "os.unshare", "os.setns",
            "sys.__stdin__"}
    missing = []
    for name in getattr(policy, table):
        module, _, attr = name.rpartition(".")
        if name not in gone and not hasattr(importlib.import_module(module), attr):
            missing.append(name)
    assert not missing, missing


def test_a_syntax_error_is_left_to_the_tests():
    assert policy.review_source("def f(:\n") == []
