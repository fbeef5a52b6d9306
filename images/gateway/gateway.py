#!/usr/bin/env python3
"""The gateway container's entrypoint and healthcheck (standard library only).

    gateway.py run      exec `smg launch` with the fleet's workers, routing policy and ports
    gateway.py health   exit 0 when the gateway answers and every configured worker is healthy

Configuration (environment; compose/gateway.yaml and the Ansible gateway role set it):
    SGLANG_RVV_GATEWAY_WORKERS   the appliances' URLs, space- or comma-separated (required)
    SGLANG_RVV_GATEWAY_HOST      address to listen on (127.0.0.1)
    SGLANG_RVV_GATEWAY_PORT      port to listen on (30000, like one appliance)
    SGLANG_RVV_GATEWAY_POLICY    smg's routing policy (cache_aware)
    SGLANG_RVV_GATEWAY_METRICS_PORT   smg's Prometheus port, on the same host (29000)
    SGLANG_RVV_GATEWAY_ARGS      further `smg launch` arguments, split like a shell would
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import urllib.error
import urllib.parse
import urllib.request

POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "least_load",
            "consistent_hashing", "prefix_hash")
# A killed appliance is found within HEALTH_INTERVAL x HEALTH_FAILURES seconds (smg's own
# defaults, 60 s x 3, would route to a dead board for three minutes); retries cover the gap.
HEALTH_INTERVAL = 5
HEALTH_FAILURES = 2


class ConfigError(Exception):
    pass


def _env(name: str, default: str) -> str:
    return os.environ.get(name, "").strip() or default


def workers() -> list[str]:
    raw = os.environ.get("SGLANG_RVV_GATEWAY_WORKERS", "").replace(",", " ").split()
    if not raw:
        raise ConfigError("SGLANG_RVV_GATEWAY_WORKERS is empty: give the appliances' URLs, "
                          "e.g. 'http://127.0.0.1:30001 http://127.0.0.1:30002'")
    for url in raw:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None \
                or parts.path not in ("", "/"):
            raise ConfigError(f"worker URL '{url}' is not scheme://host:port (e.g. http://10.0.0.21:30000)")
    if len(set(raw)) != len(raw):
        raise ConfigError(f"SGLANG_RVV_GATEWAY_WORKERS lists a worker twice: {' '.join(raw)}")
    return [url.rstrip("/") for url in raw]


def port(name: str, default: str) -> str:
    value = _env(name, default)
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ConfigError(f"{name}='{value}' is not a TCP port")
    return value


def launch_args() -> list[str]:
    policy = _env("SGLANG_RVV_GATEWAY_POLICY", "cache_aware")
    if policy not in POLICIES:
        raise ConfigError(f"SGLANG_RVV_GATEWAY_POLICY='{policy}': use one of {', '.join(POLICIES)}")
    host = _env("SGLANG_RVV_GATEWAY_HOST", "127.0.0.1")
    return [
        "smg", "launch",
        "--host", host,
        "--port", port("SGLANG_RVV_GATEWAY_PORT", "30000"),
        "--worker-urls", *workers(),
        "--policy", policy,
        "--prometheus-host", host,
        "--prometheus-port", port("SGLANG_RVV_GATEWAY_METRICS_PORT", "29000"),
        "--health-check-interval-secs", str(HEALTH_INTERVAL),
        "--health-failure-threshold", str(HEALTH_FAILURES),
        *shlex.split(os.environ.get("SGLANG_RVV_GATEWAY_ARGS", "")),
    ]


def _get_json(url: str, timeout: float) -> object:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def health() -> str | None:
    """None when the gateway is up with every configured worker healthy; else what is not."""
    host = _env("SGLANG_RVV_GATEWAY_HOST", "127.0.0.1")
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    base = f"http://{host}:{port('SGLANG_RVV_GATEWAY_PORT', '30000')}"
    try:
        listed = _get_json(f"{base}/workers", timeout=4)
    except (OSError, ValueError) as exc:
        return f"{base}/workers: {exc}"
    healthy = {w.get("url", "").rstrip("/") for w in listed.get("workers", []) if w.get("is_healthy")}
    missing = [url for url in workers() if url not in healthy]
    return f"not healthy at the gateway: {' '.join(missing)}" if missing else None


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else ""
    try:
        if command == "run":
            args = launch_args()
            print(f"gateway: smg launch on {args[3]}:{args[5]}, policy {args[args.index('--policy') + 1]}, "
                  f"workers {' '.join(workers())}", file=sys.stderr, flush=True)
            os.execvp(args[0], args)
        if command == "health":
            problem = health()
            if problem:
                print(f"gateway: {problem}", file=sys.stderr)
            return 1 if problem else 0
    except ConfigError as exc:
        print(f"gateway: error: {exc}", file=sys.stderr)
        return 2
    print("usage: gateway.py run | health", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
