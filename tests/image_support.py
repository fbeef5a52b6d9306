"""Helpers for the image tests (tests/images): the lock, build steps, containers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sglang_rvv.launch.client import get_json, post_json

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "images" / "scripts"
LOCK_PY = SCRIPTS / "lock.py"
HEALTHCHECK = "/usr/local/lib/sglang-rvv/healthcheck.py"  # compose.yaml's healthcheck, for plain podman run


def emulation_missing(machine: str) -> str | None:
    """Why MACHINE's code (riscv64, aarch64) cannot run here (not this CPU and no qemu-user binfmt), or None."""
    if os.uname().machine == machine:
        return None
    entry = Path(f"/proc/sys/fs/binfmt_misc/qemu-{machine}")
    try:
        enabled = entry.read_text().startswith("enabled")
    except OSError:
        enabled = False
    if not enabled:
        return (f"no {machine} CPU and no emulation: {entry} is not enabled (qemu-user-static binfmt; "
                "run images/scripts/podman-setup.sh as root)")
    return None


def lock_get(key: str) -> str:
    return subprocess.run(["python3", LOCK_PY, "get", key], check=True, capture_output=True, text=True).stdout.strip()


def arch_of(machine: str) -> str:
    """The lock's arch name of a machine (``uname -m``): images/lock.toml arch.*.machine."""
    return subprocess.run(["python3", LOCK_PY, "arch-of", machine], check=True, capture_output=True,
                          text=True).stdout.strip()


HOST_ARCH = arch_of(os.uname().machine)


def run(command: list[str], *, timeout: float, log: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run a build step; on failure the error carries the tail of its output."""
    began = time.monotonic()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, **kwargs)
    output = result.stdout + result.stderr
    if log is not None:
        log.write_text(output)
    print(f"$ {' '.join(map(str, command))}  ({time.monotonic() - began:.0f} s, exit {result.returncode})")
    if result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, command))} exited {result.returncode}:\n{output[-4000:]}", pytrace=False)
    return result


def build_emulated(arch: str, scripts: tuple[str, ...], logs: Path, *, timeout: float) -> None:
    """ARCH's images, built (or found up to date) by SCRIPTS in order, with ARCH's binaries under
    qemu-user; a skip that names the missing emulation where there is none."""
    reason = emulation_missing(lock_get(f"arch.{arch}.machine"))
    if reason:
        pytest.skip(reason)
    for script in scripts:
        run([str(SCRIPTS / script), arch], timeout=timeout, log=logs / f"{arch}-{script}.log")


def user_checkpoint(directory: Path, seed: int) -> Path:
    """A generated tiny Llama checkpoint at directory, as a user's own (not the lock's weights)."""
    subprocess.run([sys.executable, "-m", "sglang_rvv.checkpoint", directory, "--arch", "llama", "--seed", str(seed)],
                   check=True, capture_output=True)
    return directory


# Every .py under a directory has a .pyc that Python takes without compiling it: this Python's
# magic number, checked-hash, and the hash of the source's own bytes. It prints the number of
# sources, then one line per bad one.
_PYC_CHECK = """
import importlib.util, sys
from pathlib import Path
sources, bad = 0, []
for source in Path(sys.argv[1]).rglob("*.py"):
    sources += 1
    try:
        pyc = Path(importlib.util.cache_from_source(str(source))).read_bytes()
    except OSError:
        bad.append(f"{source}: no .pyc")
        continue
    if (pyc[:4], pyc[4:8], pyc[8:16]) != (importlib.util.MAGIC_NUMBER, (3).to_bytes(4, "little"),
                                          importlib.util.source_hash(source.read_bytes())):
        bad.append(f"{source}: not a checked-hash .pyc of this source")
print(sources, *bad, sep="\\n")
"""


def pyc_check(python: list[str], directory: str) -> tuple[int, list[str]]:
    """(sources, the bad ones) of DIRECTORY, checked by PYTHON (a podman exec or run of an image's
    python3, reading its script from stdin): the .pyc the image's build wrote."""
    out = subprocess.run([*python, directory], input=_PYC_CHECK, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return int(out[0]), out[1:]


def image_id(image: str) -> str:
    """A local image's id; fails (CalledProcessError) when podman has no such image."""
    return subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", image],
                          check=True, capture_output=True, text=True).stdout.strip()


def head_commit() -> str:
    """The commit this checkout's HEAD is."""
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def free_port() -> int:
    from sglang_rvv.launch.process import free_port as _free_port

    return _free_port()


class Container:
    """One detached container serving on 127.0.0.1:PORT; removed by :meth:`remove`."""

    def __init__(self, image: str, *, podman_args: tuple[str, ...] = (), args: tuple[str, ...] = ()):
        self.port = free_port()
        self.id = subprocess.run(
            ["podman", "run", "-d", "--init", "-p", f"127.0.0.1:{self.port}:30000", "--health-cmd", HEALTHCHECK,
             *podman_args, image, *args],
            check=True, capture_output=True, text=True,
        ).stdout.strip()

    def wait_healthy(self, timeout: float = 600) -> float:
        began = time.monotonic()
        while subprocess.run(["podman", "healthcheck", "run", self.id], capture_output=True).returncode != 0:
            state = subprocess.run(["podman", "inspect", "--format", "{{.State.Status}}", self.id],
                                   capture_output=True, text=True).stdout.strip()
            if state != "running" or time.monotonic() - began > timeout:
                pytest.fail(f"container is {state} after {time.monotonic() - began:.0f} s, not healthy:\n"
                            f"{self.logs()[-4000:]}", pytrace=False)
            time.sleep(2)
        return time.monotonic() - began

    def logs(self) -> str:
        result = subprocess.run(["podman", "logs", self.id], capture_output=True, text=True)
        return result.stdout + result.stderr

    def exec(self, *command: str) -> str:
        return subprocess.run(["podman", "exec", self.id, *command], check=True, capture_output=True,
                              text=True).stdout

    def remove(self, attempts: int = 3) -> None:
        """Stop and remove the container and its anonymous volumes. CI runs have left one behind,
        exited 0: podman stopped it and then did not remove it, and its exit status went unread.
        So the removal is retried, and a container still there after it is a failure that says why."""
        for attempt in range(attempts):
            removed = subprocess.run(["podman", "rm", "-f", "-v", "-t", "5", self.id], capture_output=True, text=True)
            if subprocess.run(["podman", "container", "exists", self.id]).returncode == 1:
                return
            time.sleep(2 * (attempt + 1))
        pytest.fail(f"podman rm -f {self.id[:12]} left the container in place after {attempts} tries "
                    f"(exit {removed.returncode}): {removed.stderr.strip()[-2000:]}", pytrace=False)


def completion(port: int, prompt: str = "Hello", max_tokens: int = 8, model: str | None = None) -> dict:
    """POST /v1/completions on 127.0.0.1:PORT, greedy. A gateway needs the MODEL to route by
    (an appliance serves its one model without it)."""
    fields = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return post_json(f"http://127.0.0.1:{port}/v1/completions", {**fields, "model": model} if model else fields)


def gateway_workers(port: int) -> dict[str, bool]:
    """The workers of the gateway on 127.0.0.1:PORT: {url: healthy}."""
    return {w["url"]: w["is_healthy"] for w in get_json(f"http://127.0.0.1:{port}/workers", timeout=10)["workers"]}


# Where the plugin writes its JSON report in an appliance (the Inductor cache volume, one
# subdirectory per cache key).
REPORT = "/var/cache/sglang-rvv/inductor/{key}/sglang_rvv_report.json"


# The compose project `make up` starts (images/scripts/compose.sh: the lock's app.name): make
# test's second lane has its own.
COMPOSE_PROJECT = os.environ.get("SGLANG_RVV_PROJECT") or lock_get("app.name")


def compose_container() -> str:
    """The container `make up` started (compose project COMPOSE_PROJECT)."""
    return subprocess.run(
        ["podman", "ps", "--filter", f"label=io.podman.compose.project={COMPOSE_PROJECT}", "--format", "{{.ID}}"],
        check=True, capture_output=True, text=True,
    ).stdout.split()[0]


def compose_report(arch: str) -> dict:
    """The policy report of the appliance `make up` serves for ARCH."""
    path = REPORT.format(key=lock_get(f"arch.{arch}.inductor_cache_key"))
    return json.loads(subprocess.run(["podman", "exec", compose_container(), "cat", path], check=True,
                                     capture_output=True, text=True).stdout)


def scrape(port: int) -> dict[str, float]:
    """/metrics on 127.0.0.1:PORT as {sample with its labels: value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        lines = reply.read().decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line and line[0] != "#"}
