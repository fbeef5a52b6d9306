"""The packed layout and the two custom ops."""

import platform

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

from sglang_rvv import host, layout, ops
from sglang_rvv.layout import BLOCK_N, LayoutError
from support import assert_bf16_close, sqnr_db


def _weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("n,k", [(1, 1), (31, 7), (32, 64), (33, 5), (100, 3), (1000, 1056)])
def test_pack_unpack_round_trip(n, k):
    weight = _weight(n, k)
    packed = ops.pack_bf16_weight(weight)
    assert tuple(packed.shape) == ((n + 31) // 32, k, BLOCK_N)
    assert packed.is_contiguous()
    assert torch.equal(layout.unpack_reference(packed, n), weight)
    # Block b, column j of the last dim is output channel b*32+j; padding is zero.
    assert torch.equal(packed[0, :, 0], weight[0])
    tail = packed.shape[0] * BLOCK_N - n
    if tail:
        assert not packed[-1, :, BLOCK_N - tail :].any()
    assert packed.numel() * packed.element_size() == layout.packed_bytes(n, k)


@pytest.mark.parametrize("n,k", [(97, 70), (1056, 1000)])
def test_packed_linear_matches_fp32_reference_for_every_m(n, k):
    weight = _weight(n, k)
    packed = ops.pack_bf16_weight(weight)
    for m in range(1, 131):
        x = _weight(m, k, seed=m)
        out = ops.packed_bf16_linear(x, packed, n)
        assert out.dtype == torch.bfloat16
        assert_bf16_close(out, F.linear(x.double(), weight.double()))


def test_packed_linear_keeps_leading_dims():
    weight = _weight(70, 40)
    x = _weight(2 * 3 * 5, 40, seed=1).reshape(2, 3, 5, 40)
    out = ops.packed_bf16_linear(x, ops.pack_bf16_weight(weight), 70)
    assert out.shape == (2, 3, 5, 70)
    assert_bf16_close(out, F.linear(x.double(), weight.double()))


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 128])
def test_compiled_packed_linear_is_generated_code(m):
    n, k = 1030, 1024
    weight = _weight(n, k)
    packed = ops.pack_bf16_weight(weight)
    fn = torch.compile(lambda x, p: ops.packed_bf16_linear(x, p, n), dynamic=False, fullgraph=True)
    x = _weight(m, k, seed=m)
    out, (code, *_) = run_and_get_code(fn, x, packed)
    # The op was decomposed and lowered, not called back as an opaque kernel.
    assert "sglang_rvv" not in code
    assert_bf16_close(out, F.linear(x.double(), weight.double()))


def test_errors_name_the_problem():
    weight = _weight(64, 32)
    packed = ops.pack_bf16_weight(weight)
    x = _weight(2, 32)
    cases = [
        (lambda: ops.pack_bf16_weight(weight.float()), "bfloat16 weight"),
        (lambda: ops.pack_bf16_weight(weight[0]), "2-D"),
        (lambda: ops.pack_bf16_weight(weight, 2), "layout version 2"),
        (lambda: ops.packed_bf16_linear(x.float(), packed, 64), "bfloat16 input"),
        (lambda: ops.packed_bf16_linear(x, packed, 64, 7), "layout version 7"),
        (lambda: ops.packed_bf16_linear(_weight(2, 16), packed, 64), "K=16"),
        (lambda: ops.packed_bf16_linear(x, packed, 65), "out_features=65"),
        (lambda: ops.packed_bf16_linear(x, packed, 32), "out_features=32"),
        (lambda: ops.packed_bf16_linear(x, weight, 64), "packed weight of shape"),
    ]
    for call, needle in cases:
        with pytest.raises(LayoutError, match=needle):
            call()


def test_fake_kernels_check_too():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        weight = torch.empty(100, 64, dtype=torch.bfloat16)
        packed = ops.pack_bf16_weight(weight)
        assert packed.shape == (4, 64, 32)
        assert ops.packed_bf16_linear(torch.empty(3, 64, dtype=torch.bfloat16), packed, 100).shape == (3, 100)
        with pytest.raises(LayoutError, match="K=8"):
            ops.packed_bf16_linear(torch.empty(3, 8, dtype=torch.bfloat16), packed, 100)


def test_generic_provider_on_this_torch():
    assert ops.PROVIDER_NAME == "generic"


@pytest.mark.parametrize("isa,has_v", [
    ("rv64imafdcv_zicbom_zicboz_zicntr_zicond_zicsr_zifencei_zihintpause_zihpm_zfh_zfhmin_zca_zcd_zba_zbb_zbc_zbs_"
     "zkt_zve32f_zve32x_zve64d_zve64f_zve64x_zvfh_zvfhmin_zvkt_sscofpmf_sstc_svinval_svnapot_svpbmt", True),
    ("rv64gcv", True),
    ("rv64imafdc_zicsr_zifencei_zve32x", False),  # an embedded vector subset is not V
    ("rv64imafdch_zvkb", False),
])
def test_v_is_read_from_the_single_letter_extensions(isa, has_v):
    from sglang_rvv.kernels import rvv

    assert rvv.isa_has_v(isa) is has_v


def test_the_rvv_provider_says_why_it_does_not_run_here(caplog):
    from sglang_rvv.kernels import choose_provider, rvv

    assert rvv.status() == (False, f"not a riscv64 machine ({platform.machine()})")
    with caplog.at_level("WARNING", logger="sglang_rvv"):
        provider, reason = choose_provider()
    assert provider.NAME == "generic" and f"rvv: not a riscv64 machine ({platform.machine()})" in reason
    assert not caplog.records  # off riscv64, generic is simply the choice
    with pytest.raises(RuntimeError, match=r"SGLANG_RVV_OP_PROVIDER='rvv' was requested .*not a riscv64 machine"):
        choose_provider("rvv")


def test_riscv64_without_v_falls_back_with_one_warning(monkeypatch, caplog):
    from sglang_rvv.kernels import choose_provider, rvv

    monkeypatch.setattr(rvv.platform, "machine", lambda: "riscv64")
    monkeypatch.setattr(host, "cpu_isa", lambda: "rv64imafdc_zicsr")
    monkeypatch.setattr(host, "hwcap", lambda: 0x112D)
    rvv._probe.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="sglang_rvv"):
            provider, _ = choose_provider()
        with pytest.raises(RuntimeError, match="no V"):
            choose_provider("rvv")
    finally:
        rvv._probe.cache_clear()
    assert provider.NAME == "generic"
    (record,) = caplog.records
    assert "the CPU reports no V (vector) extension: /proc/cpuinfo isa rv64imafdc_zicsr, AT_HWCAP 0x112d" in (
        record.getMessage())


def test_riscv64_with_v_but_no_library_names_the_path(monkeypatch, tmp_path):
    from sglang_rvv.kernels import rvv

    monkeypatch.setattr(rvv.platform, "machine", lambda: "riscv64")
    monkeypatch.setattr(host, "cpu_isa", lambda: None)
    monkeypatch.setattr(host, "hwcap", lambda: 0x112D | rvv.HWCAP_V)  # qemu-user: no isa line, V in AT_HWCAP
    monkeypatch.setenv(rvv.LIB_ENV, str(tmp_path / "libsglang_rvv_kernels.so"))
    rvv._probe.cache_clear()
    try:
        ok, reason = rvv.status()
        (tmp_path / "libsglang_rvv_kernels.so").write_bytes(b"")
        (tmp_path / "kernels.json").write_text('{"torch_version": "0.0.1", "layout_version": 1}')
        rvv._probe.cache_clear()
        ok_mismatch, reason_mismatch = rvv.status()
    finally:
        rvv._probe.cache_clear()
    assert not ok and reason.startswith(f"no kernel library at {tmp_path}/libsglang_rvv_kernels.so")
    assert not ok_mismatch
    assert f"was built for torch 0.0.1, this is torch {torch.__version__}: refusing to load it" in reason_mismatch


def test_sqnr_metric_detects_a_wrong_result():
    ref = torch.randn(64, 64, dtype=torch.float64)
    assert sqnr_db(ref.to(torch.bfloat16), ref) > 40
    assert sqnr_db(ref.to(torch.bfloat16) * 1.1, ref) < 25
