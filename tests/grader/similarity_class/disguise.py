"""Making submissions for the similarity check's tests and benchmark.

``disguise``: a copy disguised the way a student hiding it would: the local variables
renamed, the comments rewritten, the top-level functions and classes shuffled, the spacing
and blank lines changed. The result still parses; the public names the tests bind to are
kept. ``fill``: a stub with its YOUR CODE HERE blocks filled in. Used by
tests/grader/test_similarity.py and benchmarks/bench_similarity.py."""

from __future__ import annotations

import ast
import io
import keyword
import random
import re
import tokenize

WORDS = ["acc", "tmp", "val", "res", "buf", "part", "item", "thing", "piece", "data", "arr", "blob"]
_COMPACT = re.compile(r"\s*(\*\*|//|==|!=|<=|>=|->|[-+*/@%<>]=?|=)\s*")


def _local_names(tree: ast.AST) -> set[str]:
    """Names assigned inside function bodies (not parameters, not module-level names)."""
    names: set[str] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
            params |= {a.arg for a in (fn.args.vararg, fn.args.kwarg) if a is not None}
            for node in ast.walk(fn):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id not in params:
                    names.add(node.id)
    return {n for n in names if not keyword.iskeyword(n) and n != "self"}


def rename(text: str, rng: random.Random) -> str:
    names = sorted(_local_names(ast.parse(text)))
    new = {n: f"{rng.choice(WORDS)}_{i}{rng.randrange(100)}" for i, n in enumerate(names)}
    toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    out, depth = [], 0
    for i, t in enumerate(toks):
        if t.type == tokenize.OP and t.string in "([{":
            depth += 1
        elif t.type == tokenize.OP and t.string in ")]}":
            depth -= 1
        prev = next((p for p in reversed(toks[:i]) if p.type not in (tokenize.NL, tokenize.COMMENT)), None)
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        is_keyword_arg = depth > 0 and nxt is not None and nxt.string == "="
        if (t.type == tokenize.NAME and t.string in new and not (prev and prev.string == ".")
                and not is_keyword_arg):
            t = t._replace(string=new[t.string])
        elif t.type == tokenize.COMMENT:
            t = t._replace(string="# " + " ".join(rng.choice(WORDS) for _ in range(4)))
        out.append(t)
    return tokenize.untokenize(out)


def reorder(text: str, rng: random.Random) -> str:
    """Shuffle the top-level functions and classes among their own places."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    body = tree.body
    first = next((i for i, n in enumerate(body) if isinstance(n, (ast.FunctionDef, ast.ClassDef))), None)
    if first is None:
        return text

    def start(n):
        return min([n.lineno, *[d.lineno for d in getattr(n, "decorator_list", [])]]) - 1

    head = "".join(lines[:start(body[first])])
    blocks = ["".join(lines[start(n):n.end_lineno]) for n in body[first:]]
    movable = [i for i, n in enumerate(body[first:]) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    order = movable[:]
    rng.shuffle(order)
    shuffled = blocks[:]
    for dst, src in zip(movable, order):
        shuffled[dst] = blocks[src]
    return head + "\n\n".join(b.rstrip("\n") + "\n" for b in shuffled)


def reformat(text: str, rng: random.Random) -> str:
    """Compact spacing around operators on lines without strings or comments; blank lines
    added here and there inside function bodies."""
    out = []
    for line in text.splitlines():
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped and not any(c in stripped for c in "'\"#") and not stripped.startswith(("@", "def ", "class ")):
            stripped = _COMPACT.sub(r"\1", stripped).replace(",", ", ").replace(",  ", ", ")
        out.append(indent + stripped)
        if indent and stripped and not stripped.endswith((",", "(", "[", "{", "\\")) and rng.random() < 0.15:
            out.append("")
    return "\n".join(out) + "\n"


def disguise(text: str, seed: int = 0, *, shuffle: bool = True) -> str:
    """All of the above; the result parses."""
    rng = random.Random(seed)
    text = rename(text, rng)
    if shuffle:
        text = reorder(text, rng)
    text = reformat(text, rng)
    ast.parse(text)
    return text


_BLOCK = re.compile(r"^(?P<indent>[ \t]*)# YOUR CODE HERE\n[ \t]*raise NotImplementedError\(.*\)\n", re.M)


def fill(stub: str, bodies: list[str | None]) -> str:
    """The stub with its YOUR CODE HERE blocks, in order, replaced by ``bodies`` (written
    without indentation; None leaves that block as it is)."""
    it = iter(bodies)

    def one(m):
        body = next(it, None)
        if body is None:
            return m.group()
        return "".join(m["indent"] + ln + "\n" if ln.strip() else "\n" for ln in body.strip("\n").splitlines())

    return _BLOCK.sub(one, stub)
