from pathlib import Path

import pytest

from sglang_rvv import tiny

INFRA = Path(__file__).parent / "infra"


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    """tests/infra checks an inventory's hosts; it runs only when they are named (--hosts),
    which tests/ansible does against the emulated board and the deploy target."""
    if collection_path == INFRA and not config.getoption("hosts", None):
        return True
    return None


@pytest.fixture
def llama():
    return tiny.build_model("llama", seed=0)


@pytest.fixture
def qwen3():
    return tiny.build_model("qwen3", seed=0)
