import json
import time
from collections import defaultdict
from pathlib import Path

import pytest

from sglang_rvv import tiny

TESTS = Path(__file__).parent
INFRA = TESTS / "infra"
# The tiers, one a directory, each a marker of the same name (pyproject.toml lists them):
# `make check` runs the first two, `make test` all but infra and peer_tools (`make peer-test`).
TIERS = ("unit", "integration", "e2e", "images", "ansible", "infra", "peer", "peer_tools")


def pytest_addoption(parser):
    parser.addoption("--file-times", metavar="JSON", default=None,
                     help="write each test file's wall time here at the end (tests/lanes.py balances by it)")


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    """tests/infra checks an inventory's hosts; it runs only when they are named (--hosts),
    which tests/ansible does against the emulated board and the deploy target."""
    if collection_path == INFRA and not config.getoption("hosts", None):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    """Mark every test with its directory's tier, so `-m unit`, `-m "not images"` and the like select by it."""
    for item in items:
        tier = item.path.relative_to(TESTS).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in one of tests/{{{','.join(TIERS)}}}")
        item.add_marker(tier)


@pytest.fixture
def llama():
    return tiny.build_model("llama", seed=0)


@pytest.fixture
def qwen3():
    return tiny.build_model("qwen3", seed=0)


# Wall time per test file, its module fixtures' setup and teardown included: CI has a time
# limit, and the last lines of its log say where the time went.
_FILE_SECONDS: dict[str, float] = defaultdict(float)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    began = time.monotonic()
    try:
        return (yield)
    finally:
        _FILE_SECONDS[item.path.relative_to(TESTS.parent).as_posix()] += time.monotonic() - began


def pytest_terminal_summary(terminalreporter, config):
    if not _FILE_SECONDS:
        return
    if config.getoption("file_times"):
        times = {name: round(seconds, 1) for name, seconds in sorted(_FILE_SECONDS.items())}
        Path(config.getoption("file_times")).write_text(json.dumps(times, indent=1) + "\n")
    terminalreporter.section("wall time per test file")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.0f} s  {path}")
    terminalreporter.write_line(f"{sum(_FILE_SECONDS.values()):8.0f} s  in all")
