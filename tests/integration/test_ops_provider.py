"""Which op provider sglang_rvv.ops picks at import, in fresh interpreters: the RVV branch's
prims when torch registers them, and a clear failure when a forced provider is missing."""

import os
import subprocess
import sys
import textwrap


def test_rvv_prims_are_preferred_when_torch_has_them():
    """A torch that registers the RVV branch's prims gets them, and both ops go through them."""
    script = textwrap.dedent(
        """
        import torch
        import torch.nn.functional as F
        calls = []
        lib = torch.library.Library("prims", "FRAGMENT")
        lib.define("rvv_pack_bf16_weight(Tensor weight, int layout_version=1) -> Tensor")
        lib.define("rvv_packed_bf16_linear(Tensor input, Tensor packed_weight, SymInt out_features, "
                   "int layout_version=1) -> Tensor")
        def pack(w, v=1):  # the RVV branch's eager reference
            calls.append("pack")
            n, k = w.shape
            padded = F.pad(w, (0, 0, 0, (n + 31) // 32 * 32 - n))
            return padded.reshape(-1, 32, k).permute(0, 2, 1).contiguous()
        def linear(x, p, n, v=1):
            calls.append("linear")
            return F.linear(x, p.permute(0, 2, 1).reshape(-1, p.shape[1])[:n])
        lib.impl("rvv_pack_bf16_weight", pack, "CPU")
        lib.impl("rvv_packed_bf16_linear", linear, "CPU")
        from sglang_rvv import ops  # imported after the prims exist, as on the RVV torch
        w = torch.randn(40, 16, dtype=torch.bfloat16)
        out = ops.packed_bf16_linear(torch.ones(2, 16, dtype=torch.bfloat16), ops.pack_bf16_weight(w), 40)
        print(ops.PROVIDER_NAME, calls, tuple(out.shape))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "rvv_prims ['pack', 'linear'] (2, 40)"


def test_forcing_a_missing_provider_fails_clearly():
    # Importing chooses no provider; the first use does, and fails there.
    env_script = "import sglang_rvv.ops as ops; print('imported', flush=True); ops.PROVIDER_NAME"
    result = subprocess.run(
        [sys.executable, "-c", env_script], capture_output=True, text=True,
        env={**os.environ, "SGLANG_RVV_OP_PROVIDER": "rvv_prims"},
    )
    assert result.returncode != 0 and result.stdout == "imported\n"
    assert "SGLANG_RVV_OP_PROVIDER='rvv_prims' was requested" in result.stderr
