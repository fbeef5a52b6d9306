import pytest

from sglang_rvv import tiny


@pytest.fixture
def llama():
    return tiny.build_model("llama", seed=0)


@pytest.fixture
def qwen3():
    return tiny.build_model("qwen3", seed=0)
