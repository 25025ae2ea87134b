"""Running untrusted lab code: the host side (``runner``) and the files that run inside
the sandbox (``boot`` and ``plugin``, copied into each submission's scratch folder)."""
