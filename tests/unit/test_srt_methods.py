"""SGLang quant methods and the module gate, on SGLang's own classes (no server)."""

import torch

from sglang_rvv.srt.methods import RvvLinearMethod, RvvLmHeadMethod, install_route, sglang_gate


def _module(method, tp_size=1):
    module = torch.nn.Module()
    module.quant_method = method
    module.tp_size = tp_size
    return module


def test_linear_method_keeps_sglang_isinstance_checks():
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    module = _module(UnquantizedLinearMethod())
    install_route(module, route=object())
    assert type(module.quant_method) is RvvLinearMethod
    assert isinstance(module.quant_method, UnquantizedLinearMethod)


def test_lm_head_method_is_applied_by_the_logits_processor():
    from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod

    module = _module(UnquantizedEmbeddingMethod())
    module.weight = torch.nn.Parameter(torch.zeros(4, 4), requires_grad=False)
    assert not should_apply_lm_head_quant_method(module, module.quant_method)
    install_route(module, route=object())
    assert type(module.quant_method) is RvvLmHeadMethod
    # LogitsProcessor now calls our apply() for the logits matmul...
    assert should_apply_lm_head_quant_method(module, module.quant_method)
    # ...while the embedding lookup is UnquantizedEmbeddingMethod's own, on the original weight.
    assert RvvLmHeadMethod.embedding is UnquantizedEmbeddingMethod.embedding


def test_gate_leaves_sharded_and_quantized_modules_alone():
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    assert sglang_gate(_module(UnquantizedLinearMethod())) is None
    assert "tensor parallel size 2" in sglang_gate(_module(UnquantizedLinearMethod(), tp_size=2))

    class Fp8LinearMethod:
        pass

    assert sglang_gate(_module(Fp8LinearMethod())) == "gate: quantized (Fp8LinearMethod)"


def test_a_routed_sglang_projection_skips_module_call_and_keeps_its_hooks():
    """SGLang's forward and the method's apply reach the route without nn.Module.__call__; a
    forward hook still runs (nn.Module.__call__ again)."""
    from sglang.srt.layers.linear import ReplicatedLinear

    from sglang_rvv.direct_call import DirectCall

    module = ReplicatedLinear(8, 4, bias=False, params_dtype=torch.float32)
    # SGLang allocates the weight with torch.empty: a NaN left in that memory never equals itself.
    torch.nn.init.normal_(module.weight, generator=torch.Generator().manual_seed(0))
    seen = []

    def route(layer, x, weight, bias):
        seen.append((layer, weight, bias))
        return x @ weight.t()

    install_route(module, route=route)
    assert isinstance(module, DirectCall) and type(module).__name__ == "ReplicatedLinear"
    x = torch.ones(2, 8)
    out, bias = module(x)
    assert bias is None and torch.equal(out, x @ module.weight.t())
    assert seen == [(module, module.weight, None)]
    handle = module.register_forward_hook(lambda mod, args, result: (result[0] * 2, result[1]))
    assert torch.equal(module(x)[0], 2 * (x @ module.weight.t())) and len(seen) == 2
    handle.remove()
