"""cache_build.warm on what the warm-up server reports (the server itself is the image tests'): a
provider whose packed calls are not compiled (rvv) warms a cache of no keys and says why; a packed
model with no keys and no such reason is still an error."""

import json

import pytest

from sglang_rvv import RvvPolicyConfig, cache_build
from sglang_rvv.checkpoint import write_tiny_checkpoint
from sglang_rvv.inductor_cache import MANIFEST


def _serving(monkeypatch, report: dict) -> None:
    """SGLangServer replaced by one that writes ``report`` where --cpu-rvv-report-path says."""
    class Server:
        def __init__(self, model_dir, *, extra_args, **kwargs):
            self.path = extra_args[extra_args.index("--cpu-rvv-report-path") + 1]

        def __enter__(self):
            with open(self.path, "w") as out:
                json.dump(report, out)
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(cache_build, "SGLangServer", Server)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("model") / "tiny"
    write_tiny_checkpoint(out, "llama", 0)
    return out


def test_packed_calls_that_are_not_compiled_warm_an_empty_cache_and_say_why(monkeypatch, model_dir, tmp_path, capsys):
    why = "provider rvv: each is one native op, called as it is (compiling would only wrap it)"
    _serving(monkeypatch, {"packed": ["model.layers.0.self_attn.o_proj"], "provider": "rvv",
                           "warmup": {"keys": [], "compiled": 0, "cache_hits": 0, "seconds": 0.1,
                                      "route_table": [], "packed_not_compiled": why}})
    manifest = cache_build.warm(model_dir, tmp_path / "cache", RvvPolicyConfig(), timeout=10)
    assert manifest["shape_keys"] == [] and json.loads((tmp_path / "cache" / MANIFEST).read_text()) == manifest
    assert f"1 projections packed, whose calls are not compiled ({why})" in capsys.readouterr().err


def test_a_packed_model_with_no_keys_and_no_reason_is_an_error(monkeypatch, model_dir, tmp_path):
    _serving(monkeypatch, {"packed": ["model.layers.0.self_attn.o_proj"], "provider": "generic",
                           "warmup": {"keys": [], "compiled": 0, "cache_hits": 0, "seconds": 0.1}})
    with pytest.raises(RuntimeError, match="compiled no shape keys"):
        cache_build.warm(model_dir, tmp_path / "cache", RvvPolicyConfig(), timeout=10)
