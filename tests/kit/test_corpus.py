"""Lab 07's shipped corpus: present, about 1 MB, plain ASCII, free of Project Gutenberg's
licence text, and the script that rebuilds it strips that text."""

import importlib.util

from gptkit.testing.layout import KIT_ROOT

DATA = KIT_ROOT / "labs" / "07_training" / "data"


def _builder():
    spec = importlib.util.spec_from_file_location("build_corpus", DATA / "build_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_corpus_is_shipped_and_clean():
    raw = (DATA / "shakespeare.txt").read_bytes()
    assert 900_000 <= len(raw) <= 1_200_000, f"the corpus should be about 1 MB, it is {len(raw):,} bytes"
    text = raw.decode("ascii")
    assert "gutenberg" not in text.lower(), "the corpus still holds Project Gutenberg's licence text"
    assert "\r" not in text and "\n\n\n" not in text, "line ends are \\n and blank lines come one at a time"
    assert text.startswith("HAMLET") and "Enter" in text


def test_build_script_strips_the_licence():
    sample = ("The Project Gutenberg EBook of Hamlet\r\nLicence text\r\n*** START OF THIS PROJECT GUTENBERG EBOOK ***\r\n"
              "\r\nHAMLET\r\n\r\n\r\n\r\nBer.\r\nWho's there?\r\n*** END OF THIS PROJECT GUTENBERG EBOOK ***\r\nmore licence\r\n")
    assert _builder().strip_gutenberg(sample) == "HAMLET\n\nBer.\nWho's there?"
