"""The task lab 11's assistant learns: adding two whole numbers, asked in several ways, and
saying what it can do when asked anything else.

    <|user|>What is 27 + 15?<|assistant|>42<|end|>
    <|user|>add 27 and 15<|assistant|>42<|end|>
    <|user|>who are you?<|assistant|>I only add numbers.<|end|>

The answer is checked exactly (a verifiable reward), the problems are endless and cheap to
make, and a small GPT learns them on two CPU cores in minutes. Both numbers are drawn
uniformly from 0 … ``MAX_OPERAND`` (49); the answer is their sum in decimal, no spaces.

**Phrasings.** A question is one of ``ALL_PHRASINGS`` filled in with the two numbers: each
is built from pieces (an opening such as ``What is ``, the sum as ``27+15``, ``27 + 15`` or
``27 plus 15``, a closing ``?`` or none; or ``add 27 and 15`` with its own verbs and
closings). ``HELD_OUT_PHRASINGS`` are three of those combinations that never appear in
training, though every piece of them does: they measure whether the model reads numbers in
a wording it has not seen. ``TRAIN_PHRASINGS`` are all the others. ``PHRASINGS`` are the
ones evaluation asks in: six training phrasings and the held-out ones. Every
question goes through ``normalise`` (outer spaces dropped, runs of spaces made one), in
training and in the chat alike.

**Off-task questions.** ``OFF_TASK_TRAIN`` and ``OFF_TASK_HELD_OUT`` are questions that are not
additions (disjoint lists); the right answer to each is ``REFUSAL``, one fixed sentence.

**Held-out problems** never appear in training: ``held_out(seed)`` draws distinct pairs for
evaluation from a generator seeded with ``seed``, each asked in one phrasing (in turn over
``PHRASINGS``), and ``TrainingProblems`` draws training pairs from its own generator,
redrawing any pair that is held out. The same seed gives the same problems on every machine
(NumPy's PCG64 generator).

Tokens: ``tokenizer(Tokenizer)`` makes a lab-10 ``Tokenizer`` with the 256 single bytes as
its vocabulary, no merges, and lab 11's chat tokens as specials (ids 256, 257, 258): every
character is one token, so the model sees each digit on its own, and nothing needs to be
trained or shipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

MAX_OPERAND = 49
HELD_OUT = 400
CHAT_TOKENS = ("<|user|>", "<|assistant|>", "<|end|>")  # lab 11's USER, ASSISTANT, END
REFUSAL = "I only add numbers."

_ASK_OPENINGS = ("", "What is ", "what is ", "What's ", "Compute ", "calculate ")
_SUMS = ("{a}+{b}", "{a} + {b}", "{a} plus {b}")
_ASK_CLOSINGS = ("", "?", "=", " =")
_ADD_VERBS = ("add ", "Add ", "please add ")
_ADD_CLOSINGS = ("", "?", ".")
ALL_PHRASINGS = tuple(o + m + c for o in _ASK_OPENINGS for m in _SUMS for c in _ASK_CLOSINGS) + tuple(
    v + "{a} and {b}" + c for v in _ADD_VERBS for c in _ADD_CLOSINGS)
HELD_OUT_PHRASINGS = (
    "{a} + {b}",
    "What is {a} plus {b}?",
    "add {a} and {b}?",
)
TRAIN_PHRASINGS = tuple(ph for ph in ALL_PHRASINGS if ph not in HELD_OUT_PHRASINGS)
PHRASINGS = (  # the phrasings evaluation asks in: six that training shows, and the held-out ones
    "What is {a}+{b}?",
    "What is {a} + {b}?",
    "{a}+{b}",
    "{a} plus {b}",
    "add {a} and {b}",
    "what is {a} plus {b}?",
) + HELD_OUT_PHRASINGS

_COUNTRIES = ("France", "Peru", "Japan", "Kenya", "Norway", "Chile", "Egypt", "India", "Spain", "Canada")
_THINGS = ("the sea", "a cat", "the moon", "rain", "bread", "music", "a tree", "winter", "coffee", "the sun")
_NAMES = ("Ada", "Alan", "Marie", "Isaac", "Grace", "Linus", "Emmy", "Carl", "Rosa", "Niels")
_TRAIN_TEMPLATES = (
    "hello", "hi", "hi there", "who are you?", "Who are you?", "what can you do?", "How are you?", "thanks",
    "tell me a joke", "what is your name?", "What time is it?", "help", "good night", "ok",
    "what is the capital of {country}?", "write a poem about {thing}", "tell me about {thing}",
    "who is {name}?", "What is {thing}?", "I like {thing}", "where is {country}?", "say hi to {name}",
    "what is {a} times {b}?", "{a} minus {b}", "multiply {a} by {b}", "what is {a}?", "{a}", "is {a} big?",
    "good evening", "sing a song", "are you a robot?", "what do you like?", "my name is {name}",
    "how big is {country}?", "do you like {thing}?", "tell me about {name}", "open the door", "what is love?",
    "What is {a} times {b}?", "What's {a} minus {b}?", "Compute {a} minus {b}", "calculate {a} times {b}",
    "{a}*{b}", "{a} * {b}", "{a}-{b}", "{a} - {b}", "{a}/{b}", "{a} x {b}", "{a} times {b}=",
    "take {a} from {b}", "{a} to the power of {b}", "is {a} more than {b}?", "what is half of {a}?",
    "count to {a}", "what comes after {a}?", "{a} or {b}?", "multiply {a} and {b}", "what is {a} squared?",
)
_HELD_OUT_TEMPLATES = (
    "Hello!", "good morning", "can you help me?", "what are you?", "Who made you?", "bye",
    "what is the weather in {country}?", "explain {thing}", "Do you know {name}?", "draw {thing}",
    "what is {a} divided by {b}?", "subtract {a} from {b}", "how old is {name}?", "why is {thing} nice?",
)


def normalise(text: str) -> str:
    """A question as training renders it: outer whitespace dropped, each run of whitespace
    inside made one space. The chat sends what it reads through this too."""
    return re.sub(r"\s+", " ", text).strip()


@dataclass(frozen=True)
class Problem:
    """One addition: the numbers ``a`` and ``b`` asked in ``phrasing`` (a template with
    ``{a}`` and ``{b}``); ``question`` (the user's text) and ``answer`` (the exact reply)."""

    a: int
    b: int
    phrasing: str = TRAIN_PHRASINGS[0]

    @property
    def question(self) -> str:
        return normalise(self.phrasing.format(a=self.a, b=self.b))

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


@dataclass(frozen=True)
class OffTask:
    """A question that is not an addition; its one right answer is ``REFUSAL``."""

    question: str

    answer = REFUSAL
    messages = Problem.messages


def _fill(template: str, rng: np.random.Generator) -> str:
    a, b = (int(x) for x in rng.integers(0, 100, size=2))  # numbers in off-task questions: up to 99
    return normalise(template.format(a=a, b=b, country=_COUNTRIES[rng.integers(len(_COUNTRIES))],
                                     thing=_THINGS[rng.integers(len(_THINGS))], name=_NAMES[rng.integers(len(_NAMES))]))


def off_task(rng: np.random.Generator, n: int, *, held_out: bool = False) -> list[OffTask]:
    """``n`` off-task questions from the training templates (or the held-out ones)."""
    templates = _HELD_OUT_TEMPLATES if held_out else _TRAIN_TEMPLATES
    return [OffTask(_fill(templates[i % len(templates)], rng)) for i in rng.permutation(max(n, len(templates)))[:n]]


def tokenizer(tokenizer_class):
    """A byte-level lab-10 ``Tokenizer`` (``tokenizer_class``, the bound tree's) with no
    merges and the chat tokens as specials: 259 ids, one per character."""
    vocab = {i: bytes([i]) for i in range(256)}
    return tokenizer_class(vocab, [], special_tokens=CHAT_TOKENS)


def _pairs(rng: np.random.Generator, n: int, top: int) -> np.ndarray:
    return rng.integers(0, top + 1, size=(n, 2))


def held_out(seed: int, n: int = HELD_OUT, phrasings: tuple[str, ...] = PHRASINGS, top: int = MAX_OPERAND
             ) -> list[Problem]:
    """``n`` distinct problems with numbers up to ``top`` kept for evaluation, the same for a
    given seed; problem i is asked in ``phrasings[i % len(phrasings)]``."""
    limit = (top + 1) ** 2 // 2
    if not 1 <= n <= limit:
        raise ValueError(f"the held-out set holds 1 … {limit} problems (half of them all at most), got {n}")
    rng = np.random.default_rng([seed, 0])
    seen: dict[tuple[int, int], None] = {}
    while len(seen) < n:
        for a, b in _pairs(rng, n, top):
            seen.setdefault((int(a), int(b)))
            if len(seen) == n:
                break
    return [Problem(a, b, phrasings[i % len(phrasings)]) for i, (a, b) in enumerate(seen)]


def held_out_off_task(seed: int, n: int = 60) -> list[OffTask]:
    """``n`` off-task questions from templates training never uses."""
    return off_task(np.random.default_rng([seed, 5]), n, held_out=True)


class TrainingProblems:
    """An endless, seeded stream of training problems, none of them in ``held_out(seed)``,
    each asked in one of ``TRAIN_PHRASINGS`` drawn at random.

    ``draw(n)`` returns the next ``n`` problems; a ``stream`` number gives an independent
    stream from the same seed (the pipeline uses one for SFT, one for RL, one for DPO);
    ``top`` is the largest number drawn.
    """

    def __init__(self, seed: int, stream: int = 1, held: list[Problem] | None = None, top: int = MAX_OPERAND):
        self._rng, self._top = np.random.default_rng([seed, stream]), top
        self._phrasing = np.random.default_rng([seed, stream, 1])  # its own: draw(n) then draw(m) is draw(n + m)
        self._held = {(p.a, p.b) for p in (held if held is not None else held_out(seed))}

    def draw(self, n: int) -> list[Problem]:
        out: list[Problem] = []
        while len(out) < n:
            for a, b in _pairs(self._rng, n - len(out), self._top):
                if (int(a), int(b)) not in self._held:
                    phrasing = TRAIN_PHRASINGS[int(self._phrasing.integers(len(TRAIN_PHRASINGS)))]
                    out.append(Problem(int(a), int(b), phrasing))
        return out


def parse_question(text: str) -> Problem | None:
    """The problem a typed question asks in any of ``ALL_PHRASINGS`` (spaces aside), or None."""
    body = normalise(text)
    for phrasing in ALL_PHRASINGS:
        pattern = re.escape(normalise(phrasing)).replace(r"\{a\}", r"(\d+)").replace(r"\{b\}", r"(\d+)")
        pattern = pattern.replace(r"\ ", r"\s*").replace(r"\+", r"\s*\+\s*")
        m = re.fullmatch(pattern, body)
        if m:
            return Problem(int(m.group(1)), int(m.group(2)), phrasing)
    return None
