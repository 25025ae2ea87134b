"""Data the kit ships: GPT-2's tokenizer files (see ``gpt2/README.md`` and ``gpt2/LICENSE``), and
the small GPT trained on the kit's Shakespeare that the notebooks look inside
(``shakespeare_bpe/``, made by ``python -m gptkit.shakespeare_model``; see its ``README.md``),
and the smaller draft beside it for lab 12's speculative decoding (``shakespeare_bpe_draft/``,
made by ``python -m gptkit.shakespeare_model --draft``)."""

from __future__ import annotations

from pathlib import Path

GPT2_DIR = Path(__file__).resolve().parent / "gpt2"
ENDOFTEXT = "<|endoftext|>"


def gpt2_files() -> tuple[Path, Path]:
    """``(vocab.json, merges.txt)`` of GPT-2's byte-level BPE, as shipped with the kit."""
    return GPT2_DIR / "vocab.json", GPT2_DIR / "merges.txt"
