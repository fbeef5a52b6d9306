"""SGLang integration: flags, hooks, the adapter of SGLang's models, their quant methods and
the workarounds of SGLang bugs, loaded through SGLang's plugin system.

Nothing in this package is imported unless SGLang loads the ``sglang.srt.plugins`` entry point
(``sglang_rvv.srt.plugin:register``); the plugin registers the SGLang adapter with
:mod:`sglang_rvv.adapters` before it installs the policy. The harness (the entrypoint, the
cache build, the benchmarks) reads its flags and metrics; the policy never imports it.
"""
