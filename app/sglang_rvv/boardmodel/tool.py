"""The counting qemu and its plugin: pinned by images/lock.toml ``[tools.count]``, checked before
every run, the plugin built with the host gcc into ``.cache/count/`` and kept while its inputs
(source digest, qemu package version, compiler) are unchanged.

Every refusal is one line naming what differs and the fix; nothing here returns a silent zero.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
LOCK = REPO / "images" / "lock.toml"
SOURCE = Path(__file__).with_name("plugin") / "count.c"
CACHE = REPO / ".cache" / "count"
STAMP = "built-for.json"


class ToolError(Exception):
    """A counting input that does not match its pin; the message names it and the fix."""


def lock() -> dict:
    return tomllib.loads(LOCK.read_text())


def pins() -> dict:
    try:
        return lock()["tools"]["count"]
    except KeyError:
        raise ToolError(f"{LOCK}: no [tools.count] section; the board model's counter is pinned "
                        "there") from None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def installed_version(package: str) -> str | None:
    result = subprocess.run(["dpkg-query", "-W", "-f", "${Status} ${Version}", package],
                            capture_output=True, text=True)
    status = result.stdout.split()
    if result.returncode or status[:3] != ["install", "ok", "installed"]:
        return None
    return status[3]


@dataclass(frozen=True)
class Tool:
    qemu: Path
    plugin: Path
    qemu_cpu: str
    qemu_version: str


def check_qemu(p: dict) -> str:
    version = installed_version(p["qemu_package"])
    want = p["qemu_package_version"]
    if version is None:
        raise ToolError(f"{p['qemu_package']} is not installed: apt-get install "
                        f"{p['qemu_package']}={want} (Debian's dynamic qemu-user; the static one has "
                        "no plugin support)")
    if version != want:
        raise ToolError(f"{p['qemu_package']} {version} is installed, images/lock.toml "
                        f"[tools.count] pins {want}: install that version or update the pin with "
                        "a reviewed reason (the plugin API and counts may differ)")
    if not Path(p["qemu_binary"]).is_file():
        raise ToolError(f"{p['qemu_binary']} is missing although {p['qemu_package']} is installed: "
                        f"apt-get install --reinstall {p['qemu_package']}")
    return version


def check_source(p: dict) -> str:
    digest = sha256(SOURCE)
    if digest != p["plugin_source_sha256"]:
        raise ToolError(f"{SOURCE.relative_to(REPO)} has sha256 {digest}, images/lock.toml "
                        f"[tools.count] plugin_source_sha256 pins {p['plugin_source_sha256']}: a "
                        "changed counter changes every baseline; pin the new digest with a reason")
    return digest


def gcc_version() -> str:
    return subprocess.run(["gcc", "-dumpfullversion"], capture_output=True, text=True,
                          check=True).stdout.strip()


def build(cache: Path = CACHE) -> Tool:
    """The checked qemu and the plugin built for it (reused while its inputs are unchanged)."""
    p = pins()
    qemu_version = check_qemu(p)
    digest = check_source(p)
    inputs = {"source_sha256": digest, "qemu_package_version": qemu_version, "gcc": gcc_version(),
              "plugin_api_version": p["plugin_api_version"]}
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    out = cache / f"plugin-{key}"
    plugin = out / "libcount.so"
    if not (out / STAMP).is_file():
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra",
                        "-Werror", "-o", str(plugin), str(SOURCE)], check=True)
        (out / STAMP).write_text(json.dumps(inputs, indent=1, sort_keys=True) + "\n")
    check_stamp(out / STAMP, qemu_version)
    return Tool(Path(p["qemu_binary"]), plugin, p["qemu_cpu"], qemu_version)


def check_stamp(stamp: Path, qemu_version: str) -> None:
    built_for = json.loads(stamp.read_text())["qemu_package_version"]
    if built_for != qemu_version:
        raise ToolError(f"{stamp.parent / 'libcount.so'} was built for qemu-user {built_for}, the "
                        f"installed one is {qemu_version}: remove {stamp.parent} to rebuild it")


def check_loads_plugin(tool: Tool, scratch: Path, guest: Path, rootfs: Path | None = None) -> None:
    """Run ``guest`` (the rootfs's /usr/bin/true) under the plugin: a qemu without plugin support
    (or one that rejects the plugin) must fail here, not produce an empty count later."""
    scratch.mkdir(parents=True, exist_ok=True)
    out = scratch / "probe.count"
    out.unlink(missing_ok=True)
    prefix = ["-L", str(rootfs)] if rootfs else []
    result = subprocess.run([str(tool.qemu), *prefix, "-cpu", tool.qemu_cpu, "-plugin",
                             f"{tool.plugin},out={out}", str(guest)], capture_output=True, text=True)
    if result.returncode or not out.is_file():
        reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolError(f"{tool.qemu} did not run the counting plugin ({reason}): it needs Debian's "
                        "dynamic qemu-user with plugin support, not qemu-user-static")
