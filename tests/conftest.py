"""The one switch between the student's code and the reference code.

    uv run pytest                       # tests labs/*/src   (the student's code)
    uv run pytest --impl=solutions      # tests solutions/*  (the reference)
    uv run pytest --impl=PATH           # tests any tree laid out like either

Each test folder ``tests/NN_name/`` belongs to lab NN and gets the marker ``labNN``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from gptkit.testing import loader
from gptkit.testing.layout import LAB_DIR_RE, bind_tree, resolve_impl

# Same examples every run: a grade must not depend on the day's random draw.
settings.register_profile(
    "kit", derandomize=True, deadline=None, max_examples=25,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("kit")


def pytest_addoption(parser):
    parser.addoption(
        "--impl",
        default="labs",
        help="code under test: 'labs' (student code, default), 'solutions', or a path to a tree of NN_name folders",
    )


def pytest_configure(config):
    root = resolve_impl(config.getoption("--impl"))
    try:
        bind_tree(root)
    except ValueError as exc:
        raise pytest.UsageError(f"--impl={config.getoption('--impl')}: {exc}") from None
    loader.set_root(root)
    config._kit_impl_root = root


def pytest_report_header(config):
    return f"code under test: {config._kit_impl_root}"


def pytest_collection_modifyitems(config, items):
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        if LAB_DIR_RE.match(folder):
            item.add_marker(getattr(pytest.mark, f"lab{folder[:2]}"))
        elif folder in ("kit", "grader"):
            item.add_marker(pytest.mark.kit)
