"""SGLang integration: flags, hooks and quant methods, loaded through SGLang's plugin system.

Nothing in this package is imported unless SGLang loads the ``sglang.srt.plugins``
entry point (``sglang_rvv.srt.plugin:register``) or an SGLang model is adapted.
"""
