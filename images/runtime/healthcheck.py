#!/usr/bin/env python3
"""Container healthcheck: exit 0 when GET /health on the local SGLang server answers 200."""

import os
import sys
import urllib.request

url = f"http://127.0.0.1:{os.environ.get('SGLANG_RVV_PORT', '30000')}/health"
# The healthcheck's own limit (compose's timeout, the same variable) less a second, so a slow
# answer is reported here rather than the check being killed without a word.
timeout = max(float(os.environ.get("SGLANG_RVV_HEALTH_TIMEOUT", "5")) - 1, 1)
try:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        sys.exit(0 if reply.status == 200 else 1)
except Exception as exc:  # refused while starting, 503 while warming up, timeout
    print(f"{url}: {exc}", file=sys.stderr)
    sys.exit(1)
