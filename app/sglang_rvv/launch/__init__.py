"""SGLang servers started from Python, split by job so each user imports only its part.

* :mod:`.args`: the SGLang command line for bf16 serving on CPU (the container entrypoint
  needs this alone);
* :mod:`.process`: :class:`~.process.SGLangServer`, one server's process group, for tests,
  benchmarks, the cache build and local serving;
* :mod:`.client`: the server's HTTP requests (``urllib`` only);
* ``python -m sglang_rvv.launch MODEL_DIR``: a foreground server with the same defaults.
"""
