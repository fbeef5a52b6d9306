"""Where a decode token's time goes on the board, from emulated instruction counts.

``plugin/count.c`` is a qemu-user TCG plugin that counts whole guest processes; ``tool`` builds it
and checks its pinned inputs; ``rootfs`` prepares the riscv64 runtime image's rootfs for
``qemu -L``; ``guest`` is the workload that runs inside it; ``counts`` attributes the plugin's
tables to components; ``run`` ties them together; ``model`` is the stated board model; the command
line (``python -m sglang_rvv.boardmodel``) writes ``board-model.json`` into a run directory.
llama.cpp goes on the same instrument: ``peer_build`` finds its builds (peer/build.sh),
``peer_models`` makes its GGUF files of the same shapes and weights, ``peer`` counts it, and
``compare`` (``make peer-compare``) prices both engines with one model into ``peer-compare.json``.

Counts are not cycles: everything the model derives from them is a model, not a measurement.
This package runs on the x86 host only; nothing in the policy imports it.
"""
