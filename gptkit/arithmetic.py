"""The task lab 11's assistant learns: adding two whole numbers, posed as chat.

    <|user|>What is 347+85?<|assistant|>432<|end|>

The answer is checked exactly (a verifiable reward), the problems are endless and cheap to
make, and a small GPT learns them on two CPU cores in minutes. Both numbers are drawn
uniformly from 0 … ``MAX_OPERAND`` (99: two digits at most, 10,000 problems in all); the
answer is their sum in decimal, no spaces.

Held-out problems never appear in training: ``split(seed)`` draws ``HELD_OUT`` distinct
pairs for evaluation from a generator seeded with ``seed``, and ``TrainingProblems`` draws
training pairs from its own generator, redrawing any pair that is held out. The same seed
gives the same problems on every machine (NumPy's PCG64 generator).

Tokens: ``tokenizer(Tokenizer)`` makes a lab-10 ``Tokenizer`` with the 256 single bytes as
its vocabulary, no merges, and lab 11's chat tokens as specials (ids 256, 257, 258): every
character of a problem is one token, so the model sees each digit on its own, and nothing
needs to be trained or shipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_OPERAND = 99
HELD_OUT = 400
CHAT_TOKENS = ("<|user|>", "<|assistant|>", "<|end|>")  # lab 11's USER, ASSISTANT, END


@dataclass(frozen=True)
class Problem:
    """One addition: ``question`` (the user's text) and ``answer`` (the exact reply)."""

    a: int
    b: int

    @property
    def question(self) -> str:
        return f"What is {self.a}+{self.b}?"

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    def messages(self, with_answer: bool = True) -> list[dict[str, str]]:
        """The conversation, as lab 11's ``render_chat`` takes it (``with_answer=False``: the
        question alone, for ``render_prompt``)."""
        turns = [{"role": "user", "content": self.question}]
        if with_answer:
            turns.append({"role": "assistant", "content": self.answer})
        return turns


def tokenizer(tokenizer_class):
    """A byte-level lab-10 ``Tokenizer`` (``tokenizer_class``, the bound tree's) with no
    merges and the chat tokens as specials: 259 ids, one per character."""
    vocab = {i: bytes([i]) for i in range(256)}
    return tokenizer_class(vocab, [], special_tokens=CHAT_TOKENS)


def _pairs(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, MAX_OPERAND + 1, size=(n, 2))


def held_out(seed: int, n: int = HELD_OUT) -> list[Problem]:
    """``n`` distinct problems kept for evaluation, the same for a given seed."""
    limit = (MAX_OPERAND + 1) ** 2 // 2
    if not 1 <= n <= limit:
        raise ValueError(f"the held-out set holds 1 … {limit} problems (half of them all at most), got {n}")
    rng = np.random.default_rng([seed, 0])
    seen: dict[tuple[int, int], None] = {}
    while len(seen) < n:
        for a, b in _pairs(rng, n):
            seen.setdefault((int(a), int(b)))
            if len(seen) == n:
                break
    return [Problem(a, b) for a, b in seen]


class TrainingProblems:
    """An endless, seeded stream of training problems, none of them in ``held_out(seed)``.

    ``draw(n)`` returns the next ``n`` problems; a ``stream`` number gives an independent
    stream from the same seed (the pipeline uses one for SFT, one for RL, one for DPO).
    """

    def __init__(self, seed: int, stream: int = 1, held: list[Problem] | None = None):
        self._rng = np.random.default_rng([seed, stream])
        self._held = {(p.a, p.b) for p in (held if held is not None else held_out(seed))}

    def draw(self, n: int) -> list[Problem]:
        out: list[Problem] = []
        while len(out) < n:
            for a, b in _pairs(self._rng, n - len(out)):
                if (int(a), int(b)) not in self._held:
                    out.append(Problem(int(a), int(b)))
        return out


def parse_question(text: str) -> Problem | None:
    """The problem a typed question asks (``What is 12+34?``, or just ``12+34``), or None."""
    body = text.strip()
    if body.lower().startswith("what is"):
        body = body[7:]
    body = body.strip().rstrip("?").strip()
    left, plus, right = body.partition("+")
    if not plus or not left.strip().isdigit() or not right.strip().isdigit():
        return None
    return Problem(int(left), int(right))
