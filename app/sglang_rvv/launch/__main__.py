"""A foreground SGLang CPU server with the defaults of :mod:`sglang_rvv.launch`; arguments after
the model directory that this module does not know go to SGLang::

    python -m sglang_rvv.launch MODEL_DIR [--port 30000] [--max-total-tokens 4096] [SGLANG ARGS...]
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from .args import DEFAULT_MAX_TOTAL_TOKENS
from .client import ServerError
from .process import DEFAULT_STARTUP_TIMEOUT, INHERIT_OUTPUT, SGLangServer


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_rvv.launch",
        description="Serve MODEL_DIR with SGLang on CPU (127.0.0.1). Unknown arguments go to SGLang.",
    )
    parser.add_argument("model_dir", help="checkpoint directory (config, weights, tokenizer)")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--max-total-tokens", type=int, default=DEFAULT_MAX_TOTAL_TOKENS)
    parser.add_argument("--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT)
    parser.add_argument("--log", default=INHERIT_OUTPUT, help="server log file (default: this terminal)")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]

    def terminate(signum, frame):
        raise KeyboardInterrupt

    # Ctrl-C, and SIGTERM from `docker stop` and friends, stop the server. Set explicitly:
    # a shell starts background jobs with SIGINT ignored, which Python would keep.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, terminate)
    server = SGLangServer(
        args.model_dir, port=args.port, extra_args=extra, log_path=args.log,
        startup_timeout=args.startup_timeout, max_total_tokens=args.max_total_tokens,
    )
    try:
        server.start()
        print(
            f"\nsglang_rvv: serving {args.model_dir} at {server.base_url} "
            f"(ready in {server.startup_seconds:.1f} s; Ctrl-C stops)\n"
            f"  curl {server.base_url}/v1/completions -H 'Content-Type: application/json' \\\n"
            f"    -d '{{\"prompt\": \"Hello\", \"max_tokens\": 16, \"temperature\": 0}}'\n",
            flush=True,
        )
        code = server.process.wait()
        print(f"sglang_rvv: server exited with code {code}", file=sys.stderr)
        return code or 1
    except ServerError as exc:
        print(f"sglang_rvv: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nsglang_rvv: stopping", file=sys.stderr)
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
