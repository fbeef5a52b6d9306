"""The kernel library's native entry and the route's C call, on the scalar twins built for this
host (tests/host_kernels.py): a packed projection's call through them gives the op's bits, is
re-planned when its weight changes, refuses what the source check refuses in one line, and
leaves hooks, grad, a dispatch mode and the profiler to torch's full call. The ops themselves:
tests/integration/test_kernel_twins.py.
"""

from __future__ import annotations

import host_kernels
import pytest
import torch
from host_kernels import QUANT, ROUTED, VERSION, K, N, bits, linear, pack

_randn = host_kernels.bf16_randn


@pytest.fixture(scope="module")
def native():
    ops = host_kernels.ops()
    assert ops.kernel_isa() == "generic"  # off riscv64 the twins are the only choice
    return ops


@pytest.fixture
def direct_entry(native, monkeypatch):
    """kernels.rvv.direct_entry over the host build: the entry beside the host kernel library."""
    from sglang_rvv.kernels import rvv

    monkeypatch.setenv(rvv.LIB_ENV, str(host_kernels.build()))
    return rvv.direct_entry


def _packed_module(native, quant, group_size, weight):
    packed = (native.pack_bf16_weight(weight, VERSION),) if quant is None else pack(native, quant, weight, group_size)
    return dict(zip(("packed", "scales"), packed, strict=False)), packed


@pytest.mark.parametrize("quant,group_size", ROUTED)
def test_the_native_entry_gives_the_ops_bits_with_the_bias_added(native, direct_entry, quant, group_size):
    weight, bias = _randn(N, K, seed=21), _randn(N, seed=22)
    buffers, packed = _packed_module(native, quant, group_size, weight)
    name = "bf16" if quant is None else quant.name
    fn, plan = direct_entry(name, weight, tuple(buffers), N, K)
    # Any rank, as the op takes it; 1200 rows are past the work under which the entry keeps the GIL.
    for x in (_randn(1, K, seed=23), _randn(2, 3, K, seed=24), _randn(1200, K, seed=29)):
        through_ops = (native.packed_bf16_linear(x, *packed, N, VERSION) if quant is None
                       else linear(native, quant, x, packed, N, K))
        assert torch.equal(bits(fn(plan, x, weight, buffers, None)), bits(through_ops))
        assert torch.equal(bits(fn(plan, x, weight, buffers, bias)), bits(through_ops.clone().add_(bias)))


def test_the_native_entry_refuses_every_weight_the_source_check_refuses(native, direct_entry):
    """None (the route then re-plans) for each change PackedWeightSource.matches catches, and for a
    released buffer; the plan holds no reference to its weight."""
    import gc
    import weakref

    weight, x = _randn(N, K, seed=25), _randn(1, K, seed=26)
    buffers, _ = _packed_module(native, None, 0, weight)
    fn, plan = direct_entry("bf16", weight, ("packed",), N, K)
    assert fn(plan, x, weight, buffers, None) is not None
    assert fn(plan, x, weight.clone(), buffers, None) is None  # another tensor with the same values
    assert fn(plan, x, weight, {}, None) is None  # the packed buffer released
    assert fn(plan, x, weight, {"packed": "not a tensor"}, None) is None
    weight.data = weight.data.clone()  # the same object, other bytes
    assert fn(plan, x, weight, buffers, None) is None
    fn, plan = direct_entry("bf16", weight, ("packed",), N, K)
    with torch.no_grad():
        weight.mul_(1)  # in place: the version counter moves
    assert fn(plan, x, weight, buffers, None) is None
    with torch.inference_mode():  # no version counter: identity, bytes and form still checked
        frozen = _randn(N, K, seed=25)
        fn, plan = direct_entry("bf16", frozen, ("packed",), N, K)
        assert fn(plan, x, frozen, buffers, None) is not None
        assert fn(plan, x, frozen.t().contiguous().t(), buffers, None) is None
    gone = weakref.ref(weight)
    del weight
    gc.collect()
    assert gone() is None


def test_the_native_entry_raises_the_ops_error_in_one_line_and_refuses_bad_arguments(native, direct_entry):
    weight = _randn(N, K, seed=27)
    buffers, _ = _packed_module(native, None, 0, weight)
    fn, plan = direct_entry("bf16", weight, ("packed",), N, K)
    with pytest.raises(RuntimeError) as raised:
        fn(plan, _randn(1, K + 1, seed=28), weight, buffers, None)
    assert str(raised.value).startswith("sglang_rvv_native::packed_bf16_linear") and "\n" not in str(raised.value)
    with pytest.raises(TypeError, match="input and weight must be tensors"):
        fn(plan, [1.0] * K, weight, buffers, None)
    with pytest.raises(ValueError, match="plan: kind 1"):
        direct_entry("int8", weight, ("packed",), N, K)  # int8 has two buffers


def test_the_native_entry_leaves_a_dispatch_mode_and_the_profiler_the_dispatchers_full_call(native, direct_entry):
    """The entry sends a plain call straight to the op's CPU kernel (redispatch); a call that a
    TorchDispatchMode or the profiler would see through torch.ops still reaches them."""
    from torch.utils._python_dispatch import TorchDispatchMode

    weight, x = _randn(N, K, seed=30), _randn(1, K, seed=31)
    buffers, packed = _packed_module(native, None, 0, weight)
    fn, plan = direct_entry("bf16", weight, ("packed",), N, K)
    want = bits(native.packed_bf16_linear(x, *packed, N, VERSION))

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.name())
            return func(*args, **(kwargs or {}))

    with torch.no_grad():
        assert torch.equal(bits(fn(plan, x, weight, buffers, None)), want)
        with Seen() as seen:
            assert torch.equal(bits(fn(plan, x, weight, buffers, None)), want)
        with torch.profiler.profile() as profile:
            fn(plan, x, weight, buffers, None)
    assert "sglang_rvv_native::packed_bf16_linear" in seen.ops, seen.ops
    assert "sglang_rvv_native::packed_bf16_linear" in {event.name for event in profile.events()}


@pytest.mark.parametrize("quant,group_size", [pytest.param(None, 0, id="bf16"), *QUANT])
def test_the_native_ops_fake_kernels_give_the_ops_shapes_at_any_rank(native, quant, group_size):
    """What torch.compile traces the native ops with (kernels.rvv registers them when the library
    loads): the op's output shape, [..., N] for an [..., K] input."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sglang_rvv.kernels import rvv

    rvv._register_fakes()
    packed = pack(native, quant, _randn(N, K, seed=35), group_size) if quant else (
        native.pack_bf16_weight(_randn(N, K, seed=35), VERSION),)
    for x in (_randn(3, K, seed=36), _randn(2, 3, K, seed=37)):
        real = native.packed_bf16_linear(x, *packed, N, VERSION) if quant is None else linear(
            native, quant, x, packed, N, K)
        with FakeTensorMode() as mode:
            fakes = [mode.from_tensor(t) for t in (x, *packed)]
            fake = native.packed_bf16_linear(*fakes, N, VERSION) if quant is None else linear(
                native, quant, fakes[0], fakes[1:], N, K)
        assert fake.shape == real.shape


def test_small_outputs_reuse_dead_outputs_blocks_and_never_a_live_ones(native):
    """outputs.cpp: an output's block is kept when it dies and handed to a later output of its
    size; outputs alive at once never share one, and each keeps its own bits."""
    weight = _randn(N, K, seed=32)
    packed = native.pack_bf16_weight(weight, VERSION)
    xs = [_randn(1, K, seed=40 + i) for i in range(8)]
    wants = [bits(native.packed_bf16_linear(x, packed, N, VERSION)).clone() for x in xs]
    live = [native.packed_bf16_linear(x, packed, N, VERSION) for x in xs]  # more than the kept blocks
    assert len({out.data_ptr() for out in live}) == len(live)
    assert all(torch.equal(bits(out), want) for out, want in zip(live, wants, strict=True))
    dead = {out.data_ptr() for out in live}
    del live
    again = [native.packed_bf16_linear(x, packed, N, VERSION) for x in xs[:4]]
    assert {out.data_ptr() for out in again} <= dead
    assert all(torch.equal(bits(out), want) for out, want in zip(again, wants[:4], strict=True))


def test_while_the_profiler_records_memory_an_output_is_torchs_allocation(native):
    weight, x = _randn(N, K, seed=33), _randn(1, K, seed=34)
    packed = native.pack_bf16_weight(weight, VERSION)
    for _ in range(2):  # the second output could take the first one's kept block
        native.packed_bf16_linear(x, packed, N, VERSION)
    with torch.profiler.profile(profile_memory=True) as profile:
        native.packed_bf16_linear(x, packed, N, VERSION)
    usage = [event.cpu_memory_usage for event in profile.key_averages()
             if event.key == "sglang_rvv_native::packed_bf16_linear"]
    assert usage and usage[0] >= N * 2, usage


def test_the_entrys_round_trip_holds_when_the_first_call_comes_from_inference_mode(direct_entry):
    """The entry loads at a route's first memoised call, which SGLang makes in inference mode, where
    a new tensor has no version counter for the round trip's stale case."""
    from sglang_rvv.kernels import entry, rvv

    module = entry.load(str(entry.path_beside(rvv.library_path())))
    assert module is not None
    with torch.inference_mode():
        assert entry.round_trip(module) is None


def test_an_entry_library_that_is_not_there_leaves_the_op_call_with_one_warning(native, tmp_path, caplog):
    from sglang_rvv.kernels import entry

    assert entry.load(str(tmp_path / entry.ENTRY_NAME)) is None
    assert f"no {tmp_path / entry.ENTRY_NAME} beside the kernel library" in caplog.text


# --- the routes' __call__ in C (csrc/entry/route_call.cpp) -----------------------------------


@pytest.fixture
def native_routes(native, monkeypatch):
    """The rvv provider over the host twins (the ISA probe would refuse them here), so a policy's
    routes get the entry's C __call__ as on the board; the classes get their Python call back after."""
    from sglang_rvv import adapters, bodies, kernels, routing
    from sglang_rvv.kernels import rvv

    # Everything the process keeps of its one chosen provider; a stale eager body (another test
    # in the process chose generic first) gave the planning call generic's bits and the memoised
    # C call the twins', one logit apart.
    derived = (kernels.chosen, routing.accelerated, bodies.eager_body, bodies.eager_call)
    monkeypatch.setenv(rvv.LIB_ENV, str(host_kernels.build()))
    monkeypatch.setattr(kernels, "choose_provider", lambda forced=None: (rvv, "the host twins, for this test"))
    monkeypatch.setattr(routing.ModuleRoute, "__call__", routing.ModuleRoute.call)
    for cache in derived:
        cache.cache_clear()
    yield routing
    if "__call__" in adapters.RoutedLinear.__dict__:
        del adapters.RoutedLinear.__call__
    for cache in derived:
        cache.cache_clear()


def _routed_tiny(seed: int = 0, **config):
    from sglang_rvv import RvvPolicyConfig, install_rvv_policy, tiny

    model = tiny.build_model("llama", seed=seed)
    install_rvv_policy(model, RvvPolicyConfig(regional_compile=False, measure_routes=False, fused_ops=False, **config))
    return model


def test_the_routes_c_call_gives_the_python_calls_bits_and_counts(native_routes):
    """A decode step through the C methods and through the routes' Python call: the same logits bit
    for bit and the same counters, and the memoised o_proj call is the op's bits."""
    from sglang_rvv import adapters
    from sglang_rvv.policy import policy_of

    routing = native_routes
    model = _routed_tiny()
    assert type(routing.ModuleRoute.__dict__["__call__"]).__name__ == "method_descriptor"
    assert type(adapters.RoutedLinear.__dict__["__call__"]).__name__ == "method_descriptor"
    prompt = torch.randint(0, model.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(2))
    counters = policy_of(model).counters
    runs = {}
    for mode in ("c", "python"):
        if mode == "python":  # the same routes and memos, through the Python code the C stands for
            routing.ModuleRoute.__call__ = routing.ModuleRoute.call
            del adapters.RoutedLinear.__call__
        with torch.inference_mode():
            model(prompt)  # plans (the first run) or re-uses the memos
            before = counters.copy()
            logits = model(prompt[:, :1]).logits
        runs[mode] = (logits, counters - before)
    assert torch.equal(bits(runs["c"][0]), bits(runs["python"][0]))
    assert runs["c"][1] == runs["python"][1] and runs["c"][1]["o_proj", "packed_eager", "1"] == 2, runs["c"][1]


def test_a_memoised_planned_call_runs_no_python_frame(native_routes):
    """What the C methods are for: a routed Linear's memoised call reaches the kernel with no Python
    frame on the way (DirectCall.__call__, RoutedLinear.forward and ModuleRoute.call stay out)."""
    import sys

    model = _routed_tiny(seed=2)
    o_proj = model.model.layers[0].self_attn.o_proj
    x = _randn(1, 1, o_proj.in_features, seed=4)
    frames = []
    with torch.inference_mode():
        o_proj(x)  # plans it
        sys.setprofile(lambda frame, event, arg: event == "call" and frames.append(frame.f_code.co_qualname))
        try:
            o_proj(x)
        finally:
            sys.setprofile(None)
    assert frames == [], frames


def test_the_routes_c_call_re_plans_a_changed_weight_and_leaves_hooks_and_grad_to_python(native_routes):
    routing = native_routes
    model = _routed_tiny(seed=1)
    o_proj = model.model.layers[0].self_attn.o_proj
    route = o_proj.__dict__[routing.ROUTE_ATTR]
    x = _randn(1, 1, o_proj.in_features, seed=3)

    def op_bits():
        packed = o_proj._buffers[route.record.buffers[0]]
        return bits(torch.ops.sglang_rvv_native.packed_bf16_linear(x, packed, o_proj.out_features, VERSION))

    with torch.inference_mode():
        o_proj(x)  # plans the decode shape
        assert route.memo.calls[x.shape, x.dtype, True].plan is not None
        assert torch.equal(bits(o_proj(x)), op_bits())
    with torch.no_grad():
        o_proj.weight.mul_(2)  # in place: the plan no longer holds, the route re-plans and repacks
        assert torch.equal(bits(o_proj(x)), op_bits())
        o_proj.weight = torch.nn.Parameter(o_proj.weight.detach().clone().neg_(), requires_grad=False)
        assert torch.equal(bits(o_proj(x)), op_bits())  # another weight object
        handle = o_proj.register_forward_hook(lambda module, args, out: out * 2)
        hooked = o_proj(x)
        handle.remove()
        assert torch.equal(bits(hooked), bits(torch.ops.sglang_rvv_native.packed_bf16_linear(
            x, o_proj._buffers[route.record.buffers[0]], o_proj.out_features, VERSION) * 2))
        o_proj.forward = lambda input: input[..., :7]  # set on the instance: it is what a call runs
        assert o_proj(x).shape[-1] == 7
        del o_proj.forward
    o_proj.weight.requires_grad_(True)
    y = o_proj(x.float().to(torch.bfloat16).requires_grad_(True))  # grad on: row-major F.linear, autograd kept
    y.sum().backward()
    assert o_proj.weight.grad is not None


def test_the_routes_c_call_reuses_its_last_memo_hit_only_until_the_memo_changes(native_routes):
    """route_call.cpp keeps a memo's last hit with its shape; a new decision for any shape
    (CallMemo.remember) drops it, so the next call takes the new decision."""
    routing = native_routes
    model = _routed_tiny(seed=3)
    o_proj = model.model.layers[0].self_attn.o_proj
    route = o_proj.__dict__[routing.ROUTE_ATTR]
    one, two = _randn(1, 1, o_proj.in_features, seed=5), _randn(1, 2, o_proj.in_features, seed=6)

    def op_bits(x):
        packed = o_proj._buffers[route.record.buffers[0]]
        return bits(torch.ops.sglang_rvv_native.packed_bf16_linear(x, packed, o_proj.out_features, VERSION))

    with torch.inference_mode():
        for x in (one, two, one, two):  # plans each shape, then the C call alternates between them
            assert torch.equal(bits(o_proj(x)), op_bits(x))
        assert route.memo.last == (tuple(two.shape), route.memo.calls[two.shape, two.dtype, True])
        row_major = ("o_proj", "row_major_test", "2")
        route.memo.remember(two, routing.MemoCall(row_major, None, 2, 2, False, ()))
        assert route.memo.last is None
        assert torch.equal(bits(o_proj(two)), bits(torch.nn.functional.linear(two, o_proj.weight)))
        assert route.context.counters[row_major] == 1


def test_the_routes_c_method_refuses_a_class_without_the_slots_it_reads(native_routes):
    from sglang_rvv import packed_state

    routing = native_routes
    native = routing.accelerated()

    class NoSlots:
        def __call__(self, *args):
            return args

    with pytest.raises(ValueError, match="NoSlots has no __slots__ member context"):
        native.route_method(NoSlots, NoSlots.__call__, packed_state.PackedRecord, routing.RouteContext,
                            routing.CallMemo, torch.bfloat16, 0, 6)


def test_with_regional_compile_the_rvv_providers_packed_calls_are_not_compiled(native_routes):
    """The rvv provider's packed calls are native ops: with regional compile on (the flag's default)
    they still take the eager route, at M=1 and in a bucket, and the warm-up compiles nothing and
    says why."""
    from sglang_rvv import RvvPolicyConfig, install_rvv_policy, tiny
    from sglang_rvv.policy import policy_of
    from sglang_rvv.warmup import warm_up

    model = tiny.build_model("llama", seed=0)
    install_rvv_policy(model, RvvPolicyConfig(measure_routes=False, fused_ops=False))
    assert policy_of(model).config.regional_compile
    # The compiled callables are the process's (other tests may have compiled these shapes): the
    # warm-up must add none of them and compile nothing.
    compiled = policy_of(model).context.compiled
    before = set(compiled.keys())
    report = warm_up(policy_of(model))
    assert set(compiled.keys()) == before and report.compiled == 0, report
    assert "native op" in report.packed_not_compiled and "not compiled" in report.summary()
    counters = policy_of(model).counters
    o_proj = model.model.layers[0].self_attn.o_proj
    with torch.inference_mode():
        for rows in (1, 3):
            o_proj(_randn(1, rows, o_proj.in_features, seed=rows))
    assert counters == {("o_proj", "packed_eager", "1"): 1, ("o_proj", "packed_eager", "4"): 1}, counters
