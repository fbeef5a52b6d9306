"""Policy smoke test that needs nothing but torch: ``python -m sglang_rvv.smoke MODEL_DIR``.

It builds a small pure-torch decoder (Llama, Qwen2 or Qwen3 layout: RMSNorm,
RoPE, grouped-query causal attention, SiLU MLP, lm_head tied or not) from the
checkpoint's ``config.json`` and ``*.safetensors``, with the module names of
transformers, twice. One copy gets the RVV policy (pack, install), the other
stays row-major, and both run side by side:

* prefill of a short prompt, batch 1 and batch 3: logits SQNR >= 35 dB;
* greedy decode (batch 1: M=1; batch 3: M=3, bucket 4, zero-padded and sliced),
  both copies fed the row-major copy's picks: the same next tokens (a different
  pick passes only as a near tie, see ``TIE_TOLERANCE``) and every step's logits
  SQNR >= 35 dB;
* the packed route was taken (at M=1 and in bucket 4 among others).

``--weight-dtype int8|int4`` (``--group-size N``) packs the quantized layout instead and
holds it to that layout's floor (``comparison.FLOORS``: a lower SQNR, greedy picks counted,
not judged); a run in which no projection took the layout fails, naming why.

No transformers, SGLang or safetensors package is needed, so it runs where the
only torch is a distribution's (Debian's python3-torch on riscv64, under qemu
too). Exit status: 0 passed, 1 mismatch (the report names it), 2 unusable
model directory or arguments. ``--compile`` turns regional compile on (one
Inductor compilation per projection and bucket: slow, especially emulated).

One module a job: :mod:`.reader` (safetensors without the package), :mod:`.decoder` (the
reference model), :mod:`.comparison` (SQNR and greedy picks) and :mod:`.cli` (the run, its
report and the command line).
"""
