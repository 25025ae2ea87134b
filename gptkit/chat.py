"""Talk to the assistant that ``python -m gptkit.assistant`` tuned, through *your* labs:
lab 05 loads the checkpoint, lab 10 tokenizes, lab 11 renders the chat, lab 06 answers.

    uv run python -m gptkit.chat                         # your code, the RL model
    uv run python -m gptkit.chat --impl solutions        # the reference code
    echo "What is 12+34?" | uv run python -m gptkit.chat --impl solutions
    uv run python -m gptkit.chat --model runs/assistant/dpo   # the DPO model (or sft)

Each line read is one question, asked on its own (the model was tuned on one-turn
conversations: ``<|user|>What is 12 + 34?<|assistant|>``), normalised as training rendered
its questions (``arithmetic.normalise``: outer spaces dropped, inner runs of spaces made
one). The answer is the model's greedy reply up to ``<|end|>`` (``--temperature`` above 0
samples instead). An answer that is neither a number nor the sentence the model was taught
is shown as what it is: ``(empty answer)`` when the model ends at once, ``(malformed: …)``
with the text quoted, and ``(unfinished: …)`` when no ``<|end|>`` comes. At a terminal it prompts with
``you>``; piped, it prints one answer per line. An empty line or end of input ends it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from gptkit import arithmetic
from gptkit.command import CommandError, run_command, use_impl
from gptkit.testing.layout import KIT_ROOT

MODEL = KIT_ROOT / "runs" / "assistant" / "rl"


def load(folder: Path, impl: str):
    """``(model, tokenizer)`` from ``folder`` through the bound tree's labs 05 and 10, or a
    CommandError naming the command that writes the folder."""
    if not (folder / "model.safetensors").is_file() or not (folder / "config.json").is_file():
        impl_flag = f" --impl {impl}" if impl != "labs" else ""
        raise CommandError(f"no tuned model in {folder}: run `uv run python -m gptkit.assistant{impl_flag}` first")
    import gpt2_weights
    import tokenizer

    return gpt2_weights.load_gpt2(folder).eval(), arithmetic.tokenizer(tokenizer.Tokenizer)


def shown(text: str, finished: bool) -> str:
    """How the chat prints an answer: a number or the taught sentence as it is; an empty
    answer, any other text (quoted) and an answer with no ``<|end|>`` marked as such, so
    that none prints as a blank or passes for an answer."""
    if not finished:
        return f"(unfinished: {text!r} and no end)"
    if not text:
        return "(empty answer)"
    if text.isdigit() or text == arithmetic.REFUSAL:
        return text
    return f"(malformed: {text!r})"  # neither a sum nor the sentence it was taught


def reply(model, tok, question: str, *, temperature: float = 0.0, rng=None) -> str:
    """The model's answer to one question (``normalise``d as in training), as ``shown``."""
    import assistant
    import generation

    question = arithmetic.normalise(question)
    prompt = assistant.render_prompt(tok, [{"role": "user", "content": question}])
    room = model.max_seq_len - len(prompt)
    if room < 1:
        raise ValueError(f"the question takes {len(prompt)} tokens with the chat tokens; this model reads at most "
                         f"{model.max_seq_len - 1} before answering")
    end_id = assistant.special_id(tok, assistant.END)
    longest = len(arithmetic.REFUSAL) + 1  # the longest answer training taught, and its END
    out = generation.generate(model, prompt[None, :], min(room, longest), temperature=temperature, rng=rng,
                              eos_token_id=end_id)[0, len(prompt):]
    said = [int(i) for i in out]
    finished = end_id in said
    return shown(tok.decode(said[: said.index(end_id)] if finished else said), finished)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gptkit.chat", description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="labs", help="whose code runs: labs (yours), solutions, or a path")
    p.add_argument("--model", default=str(MODEL), help="the tuned model's folder (default: runs/assistant/rl)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (the default) answers greedily")
    p.add_argument("--seed", type=int, default=0, help="the sampling seed (with --temperature)")
    args = p.parse_args(argv)

    def run() -> int:
        use_impl(args.impl)
        model, tok = load(Path(args.model), args.impl)
        rng = np.random.default_rng(args.seed)
        interactive = sys.stdin.isatty()
        if interactive:
            print("Ask an addition, e.g. What is 12 + 34? or add 12 and 34 (an empty line ends)")
        while True:
            if interactive:
                print("you> ", end="", flush=True)
            line = sys.stdin.readline()
            question = line.strip()
            if not question:
                return 0
            try:
                answer = reply(model, tok, question, temperature=args.temperature, rng=rng)
            except ValueError as exc:  # a question the model cannot take: say so, go on
                print(f"chat: {exc}", file=sys.stderr)
                continue
            print(f"assistant> {answer}" if interactive else answer, flush=True)

    return run_command("chat", run)


if __name__ == "__main__":
    sys.exit(main())
