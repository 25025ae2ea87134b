"""The static policy on its own: what lab code may touch is an allow-list.

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
LAB_NAME = re.compile(r"\d\d_[a-z0-9_]+")


def allowed_modules(lab: str) -> list[str]:
    """What grader/grade.py passes: the rubric's imports plus earlier labs' modules."""
    return RUBRIC[lab].allowed_imports + [m for name, mods in WANTED.items() if name <= lab for m in mods]


def check(source: str, lab: str = "01_causal_mask") -> list[str]:
    r = RUBRIC[lab]
    return [str(v) for v in policy.check_source(source, allowed_modules(lab), allowed_names=r.allowed_names,
                                                allowed_attrs=r.allowed_attrs)]


def flagged(source: str, *words: str, lab: str = "01_causal_mask") -> str:
    found = check(source, lab)
    text = " | ".join(found)
    assert found, f"expected a violation for:\n{source}"
    for w in words:
        assert w in text, f"expected {w!r} in: {text}"
    return text


HEAD = "import numpy as np\nimport math\n"


# --- honest code passes -------------------------------------------------------------------
def honest_files():
    """(label, lab, source) for every reference solution and every example student's lab file."""
    out = []
    for f in sorted(ROOT.glob("solutions/*/*.py")):
        out.append((str(f.relative_to(ROOT)), f.parent.name, f.read_text(encoding="utf-8")))
    for f in sorted(ROOT.glob("examples/submissions/alice/labs/*/src/*.py")):
        out.append((str(f.relative_to(ROOT)), f.parents[1].name, f.read_text(encoding="utf-8")))
    for z in sorted(ROOT.glob("examples/submissions/*.zip")):
        if z.stem in ("erin_cheats", "frank_fakes"):
            continue  # the cheats: see test_example_cheats_are_flagged
        with zipfile.ZipFile(io.BytesIO(z.read_bytes())) as zf:
            for name in zf.namelist():
                m = re.search(r"labs/(\d\d_[a-z0-9_]+)/src/[a-z0-9_]+\.py$", name)
                if m:
                    out.append((f"{z.name}:{name}", m.group(1), zf.read(name).decode("utf-8")))
    return out


HONEST = honest_files()


def test_the_honest_files_were_found():
    labels = [label for label, _, _ in HONEST]
    assert sum(label.startswith("solutions/") for label in labels) == len(WANTED)
    alice_labs = {p.name for p in ROOT.glob("examples/submissions/alice/labs/*") if (p / "src").is_dir()}
    assert sum("alice" in label for label in labels) == sum(len(WANTED[lab]) for lab in alice_labs) >= 6
    assert any(label.startswith("carol.zip") for label in labels)


@pytest.mark.parametrize("label,lab,source", HONEST, ids=[h[0] for h in HONEST])
def test_reference_and_example_students_pass(label, lab, source):
    assert check(source, lab) == [], label


def test_the_stubs_pass():
    for f in sorted(ROOT.glob("labs/*/src/*.py")):
        assert check(f.read_text(encoding="utf-8"), f.parents[1].name) == [], f.name


def test_example_cheats_are_flagged():
    def lab01(zipname):
        with zipfile.ZipFile(ROOT / "examples" / "submissions" / zipname) as zf:
            return zf.read(next(n for n in zf.namelist() if n.endswith("src/causal_mask.py"))).decode()
    assert "imports os" in " ".join(check(lab01("erin_cheats.zip")))
    text = " ".join(check(lab01("frank_fakes.zip")))
    assert "__eq__" in text and "monkeypatching" in text


@pytest.mark.parametrize("module", sorted(policy.MODULE_ATTRS))
def test_every_listed_attribute_exists(module):
    """The curated lists hold no typos (and nothing this NumPy/Python has dropped)."""
    mod = importlib.import_module(module)
    missing = sorted(a for a in policy.MODULE_ATTRS[module] if not hasattr(mod, a))
    assert not missing, f"{module}: {missing}"


def test_lab_modules_api_comes_from_the_stubs():
    api = policy.lab_api("causal_mask")
    assert {"softmax", "causal_mask", "additive_mask"} <= api
    assert "np" not in api and "math" not in api


# --- everyday code that must stay fine -----------------------------------------------------
@pytest.mark.parametrize("source", [
    HEAD + "x = np.zeros((2, 3), dtype=np.float32)\ny = np.linalg.norm(x, axis=-1)\n",
    HEAD + "rng = np.random.default_rng(0)\nz = rng.normal(size=3).astype(np.float32)\n",
    HEAD + "def f(x: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:\n    return x.T\n",
    HEAD + "from numpy import random, linalg\nr = random.default_rng(1)\nn = linalg.norm\n",
    HEAD + "def f(input, type='gelu', format=None, iter=3):\n    return input if type == 'gelu' else iter\n",
    HEAD + "class A:\n    def __init__(self):\n        self._w = 1\n    def eval(self):\n        return self._w\n",
    HEAD + "def f(x):\n    if not isinstance(x, int):\n        raise TypeError(f'got {type(x).__name__}')\n",
    HEAD + "def same(a, b):\n    return type(a) is type(b)\n",
    HEAD + "from typing import Optional, Sequence\nfrom dataclasses import dataclass, field\n"
           "@dataclass\nclass C:\n    xs: Sequence[int] = field(default_factory=list)\n    n: Optional[int] = None\n",
    HEAD + "from collections.abc import Iterable\nimport collections.abc\nok = collections.abc.Mapping\n",
    HEAD + "__all__ = ['f']\ndef f():\n    g = [i for i in range(3)]\n    return {k: v for k, v in zip(g, g)}\n",
    HEAD + "def f():\n    import numpy as xp\n    return xp.ones(2)\n",
    HEAD + "from causal_mask import softmax\nimport causal_mask\ny = causal_mask.additive_mask\n",
    HEAD + "if __name__ == '__main__':\n    print(math.sqrt(2.0))\n",
])
def test_everyday_code_is_fine(source):
    assert check(source, "02_embeddings") == []


def test_rubric_extras_only_where_allowed():
    src = HEAD + "import scipy.special\nfrom scipy import special\ny = scipy.special.erf(0.5) + special.erf(1.0)\n"
    assert check(src, "03_layernorm_ffn") == []
    assert "imports scipy.special" in " ".join(check(src, "01_causal_mask"))
    files = (HEAD + "import json\nfrom pathlib import Path\n"
             "def f(p):\n    with open(Path(p)) as fh:\n        h = json.loads(fh.read())\n"
             "    return np.memmap(p, mode='r'), np.fromfile(p, dtype=np.uint8)\n")
    assert check(files, "05_gpt2_weights") == []
    text = " ".join(check(files, "04_gpt_model"))
    assert "imports json" in text and "`open`" in text and "np.memmap" in text and "np.fromfile" in text


def test_dotted_allowed_attrs_lift_one_module_attribute():
    src = HEAD + "import json\ns = json.dump\nt = np.load\n"
    out = policy.check_source(src, ["numpy", "math", "json"], allowed_attrs=["json.dump"])
    assert [v.what for v in out if "json" in v.what] == []
    assert any("np.load" in v.what for v in out)


# --- the attacks ---------------------------------------------------------------------------
def test_typing_sys_is_refused():
    text = flagged("import typing\ngc = typing.sys.modules['gc']\nobjs = gc.get_objects()\n", "`typing.sys`")
    assert "line 2" in text and "lab code may not touch" in text


@pytest.mark.parametrize("source,words", [
    (HEAD + "np.os.system('ls')\n", ["`np.os`"]),
    (HEAD + "fmt = np.lib.format\n", ["`np.lib`"]),
    (HEAD + "m = np.core.multiarray\n", ["`np.core`"]),
    (HEAD + "c = np.ctypeslib.as_array\n", ["`np.ctypeslib`"]),
    (HEAD + "np.testing.assert_allclose(1, 1)\n", ["`np.testing`"]),
    (HEAD + "a = np.load('x.npy')\n", ["`np.load`"]),
    (HEAD + "np.save('x.npy', np.zeros(1))\n", ["`np.save`"]),
    (HEAD + "np.zeros(3).tofile('x')\n", ["`.tofile`"]),
    (HEAD + "np.zeros(3).ctypes.data_as(None)\n", ["`.ctypes`"]),
    (HEAD + "x = np.random.randn(3)\n", ["`np.random.randn`"]),
    (HEAD + "np.seterr(all='ignore')\n", ["`np.seterr`"]),
    (HEAD + "x = np.zeroes(3)\n", ["`np.zeroes`", "did you mean `zeros`"]),
    (HEAD + "import numpy\nx = numpy.f2py\n", ["`numpy.f2py`"]),
    (HEAD + "import numpy.testing\nnumpy.testing.assert_allclose = print\n", ["numpy.testing", "monkeypatching"]),
    (HEAD + "x = math.sys\n", ["`math.sys`"]),
    (HEAD + "import gptkit\nt = gptkit.testing\n", ["`gptkit.testing`"]),
    (HEAD + "import gptkit.checks\nn = gptkit.checks.np\n", ["`gptkit.checks.np`"]),
    (HEAD + "import causal_mask\nm = causal_mask.np.os\n", ["`causal_mask.np`"]),
])
def test_module_attributes_off_the_list_are_refused(source, words):
    flagged(source, *words, lab="02_embeddings")


@pytest.mark.parametrize("source,words", [
    (HEAD + "from numpy import testing\n", ["`testing` from numpy"]),
    (HEAD + "from numpy.lib import format\n", ["imports from numpy.lib"]),
    (HEAD + "from numpy import load\n", ["`load` from numpy"]),
    (HEAD + "from math import *\n", ["from math import *"]),
    (HEAD + "from typing import sys\n", ["`sys` from typing"]),
    (HEAD + "from typing import get_type_hints\n", ["`get_type_hints` from typing"]),
    (HEAD + "from gptkit.testing import fixtures\n", ["gptkit.testing"]),
    (HEAD + "from gptkit import demo\n", ["`demo` from gptkit"]),
    (HEAD + "from gpt2_weights import Path\n", ["`Path` from gpt2_weights"]),
    (HEAD + "from .causal_mask import softmax\n", ["relative import"]),
    (HEAD + "import gc\n", ["imports gc"]),
    (HEAD + "import importlib\n", ["imports importlib"]),
    (HEAD + "import os.path\n", ["imports os.path"]),
    (HEAD + "import collections\n", ["imports collections"]),
    (HEAD + "import scipy\n", ["imports scipy"]),
    (HEAD + "def f():\n    import sys\n    return sys.modules\n", ["imports sys"]),
])
def test_imports_off_the_list_are_refused(source, words):
    flagged(source, *words, lab="06_generation")


@pytest.mark.parametrize("source,words", [
    (HEAD + "f = getattr(np, 'o' + 's')\n", ["`getattr`"]),
    (HEAD + "b = __builtins__\n", ["`__builtins__`"]),
    (HEAD + "v = vars()\n", ["`vars`"]),
    (HEAD + "g = globals()['np']\n", ["`globals`"]),
    (HEAD + "__import__('os')\n", ["`__import__`"]),
    (HEAD + "exec('import os')\n", ["`exec`"]),
    (HEAD + "eval('1')\n", ["`eval`"]),
    (HEAD + "x = open('/etc/passwd').read()\n", ["`open`"]),
    (HEAD + "breakpoint()\n", ["`breakpoint`"]),
    (HEAD + "ok = hasattr(np, 'os')\n", ["`hasattr`"]),
    (HEAD + "d = dir(np)\n", ["`dir`"]),
    (HEAD + "s = __spec__\n", ["`__spec__`"]),
    (HEAD + "subs = type(x).__subclasses__()\n", ["__subclasses__"]),
    (HEAD + "subs = type.__subclasses__(object)\n", ["`type`", "__subclasses__"]),
    (HEAD + "f = ().__class__.__base__.__subclasses__()\n", ["__class__"]),
    (HEAD + "C = type('C', (), {'__eq__': lambda s, o: True})\n", ["`type`"]),
    (HEAD + "C = type(int)('C', (), {})\n", ["`type`"]),
    (HEAD + "t = type\n", ["`type`"]),
    (HEAD + "class M(type):\n    pass\n", ["`type`"]),
    (HEAD + "open = open\n", ["`open`", "pick another name"]),
    (HEAD + "class C:\n    eval = eval\n", ["`eval`"]),
    (HEAD + "def f():\n    return exec\nx = f()\nexec = 1\n", ["`exec`"]),
    (HEAD + "def f():\n    global open\n    return open\n", ["`open`"]),
    (HEAD + "f = [(open := open) for _ in [0]][0]\n", ["`open`"]),
])
def test_builtins_off_the_list_are_refused(source, words):
    flagged(source, *words)


@pytest.mark.parametrize("source,words", [
    # A module is only ever used as the root of a visible chain, never as a value, so an
    # alias cannot hide it from the attribute check.
    (HEAD + "f = np\nf.os\n", ["module `np` as a value"]),
    (HEAD + "g = (lambda m=np: m.os)()\n", ["module `np` as a value"]),
    (HEAD + "def h(m=np):\n    return m.os\n", ["module `np` as a value"]),
    (HEAD + "mods = [np, math]\n", ["module `np` as a value", "module `math` as a value"]),
    (HEAD + "r = np.random\nr.seed(0)\n", ["module `np.random` as a value"]),
    (HEAD + "import typing\nx = typing\n", ["module `typing` as a value"]),
    (HEAD + "sys = np.sys\n", ["`np.sys`"]),
    (HEAD + "np = np.os\n", ["`np.os`", "rebinds `np`"]),
    (HEAD + "import numpy as m\nm = 3\n", ["rebinds `m`"]),
    (HEAD + "import math as m\nimport numpy as m\n", ["two different modules"]),
])
def test_modules_cannot_be_aliased(source, words):
    flagged(source, *words)


def test_a_parameter_named_like_a_module_is_just_a_value():
    """Inside ``def f(np)`` the name is the caller's argument, not numpy; the caller had
    to pass a module as a value to abuse it, and that is refused where it happens."""
    assert check(HEAD + "def f(np):\n    return np.anything\n") == []
    assert "as a value" in " ".join(check(HEAD + "def f(np):\n    return np.x\nf(math)\n"))


@pytest.mark.parametrize("source,words", [
    (HEAD + "np.allclose = lambda *a, **k: True\n", ["monkeypatching"]),
    (HEAD + "np.random.default_rng = None\n", ["monkeypatching"]),
    (HEAD + "import causal_mask\ncausal_mask.softmax = print\n", ["monkeypatching"]),
    (HEAD + "import gptkit\ngptkit.check_ndim = print\n", ["monkeypatching"]),
    (HEAD + "def f():\n    del math.pi\n", ["monkeypatching"]),
    (HEAD + "class Same:\n    def __eq__(self, other):\n        return True\n", ["defines `__eq__`"]),
    (HEAD + "class A:\n    def __array__(self):\n        return np.ones(1)\n", ["defines `__array__`"]),
    (HEAD + "class A:\n    def __array_ufunc__(self, *a, **k):\n        return True\n", ["`__array_ufunc__`"]),
    (HEAD + "class A:\n    __eq__ = lambda s, o: True\n", ["special name `__eq__`"]),
    (HEAD + "def __getattr__(name):\n    return 1\n", ["`__getattr__`"]),
    (HEAD + "class A:\n    pass\nA.__eq__ = lambda s, o: True\n", ["`__eq__`"]),
    (HEAD + "def f(g):\n    return g.__globals__\n", ["`__globals__`"]),
    (HEAD + "def f(x):\n    return x._private\n", ["private attribute `_private`"]),
    (HEAD + "g = (i for i in [1])\nfr = g.gi_frame.f_back.f_globals\n", ["`.gi_frame`", "`.f_globals`"]),
])
def test_objects_and_monkeypatching(source, words):
    flagged(source, *words, lab="02_embeddings")


def test_violations_name_the_line_and_what_labs_may_use():
    (v,) = policy.check_source("import numpy as np\n\n\nx = np.os\n", ["numpy"])
    assert v.line == 4
    assert str(v).startswith("line 4: uses `np.os`, which lab code may not touch")
    assert "NumPy's numerical API" in str(v)


@pytest.mark.parametrize("source,hint", [
    ("import numpy as np\nx = np.load('w.npy')\n", "does not read or write files"),
    ("from numpy import savez\n", "does not read or write files"),
    ("import numpy as np\nx = np.random.randn(3)\n", "np.random.default_rng(seed)"),
    ("import numpy as np\nnp.seterr(all='ignore')\n", "np.errstate is fine"),
])
def test_often_tried_names_say_why(source, hint):
    assert hint in " ".join(map(str, policy.check_source(source, ["numpy"])))


def test_locals_that_shadow_builtins_stay_local():
    assert check(HEAD + "def f(xs):\n    return [(y := x) for x in xs], y\n") == []
    assert check(HEAD + "def f():\n    open = 3\n    return open\n") == []


def test_syntax_errors_are_left_to_the_tests():
    assert policy.check_source("def f(:\n", ["numpy"]) == []
