"""The riscv64 runtime image's rootfs, made runnable under ``qemu-riscv64 -L`` and checked against
images/lock.toml.

qemu -L prefixes the guest's absolute paths with the rootfs, but the host kernel follows
symlinks: an absolute symlink inside the rootfs would resolve on the host. The copy in
``.cache/count/rootfs-<image id>`` therefore has every absolute symlink rewritten as a relative
one; it is made once per image id and kept while podman still holds that image (about 2.5 GB
each: a copy per rebuilt image would fill the disk over a few rebuilds).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from .tool import CACHE, ToolError, lock

IMAGE = "localhost/sglang-rvv-runtime:{version}-riscv64"
VENV = Path("opt/sglang-rvv/venv")
DONE = ".count-rootfs-complete"
PARTIAL = ".partial-"  # then the copying process's pid


def image_name() -> str:
    return IMAGE.format(version=lock()["app"]["version"])


def image_id(image: str) -> str:
    result = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", image],
                            capture_output=True, text=True)
    if result.returncode:
        raise ToolError(f"no image {image}: build it with `make image-runtime ARCH=riscv64`")
    return result.stdout.strip()


def relativize_symlinks(root: Path) -> int:
    """Rewrite every absolute symlink under ``root`` as the relative link to the same target
    inside ``root``; returns how many were rewritten."""
    count = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            link = Path(dirpath) / name
            if not link.is_symlink():
                continue
            target = os.readlink(link)
            if not target.startswith("/"):
                continue
            link.unlink()
            link.symlink_to(os.path.relpath(root / target.lstrip("/"), link.parent))
            count += 1
    return count


def use_host_pseudo_filesystems(root: Path) -> Path:
    """Remove the image's empty ``proc`` and ``sys`` mount points from the copy: qemu -L looks a
    path up in the rootfs first, so an empty ``proc`` there hides the host's, and a guest that
    lists processes (psutil's ``pids()``, which SGLang's scheduler calls to find its parent) finds
    none. qemu answers ``/proc/self/...`` itself, so the guest's own maps stay its own."""
    for name in ("proc", "sys"):
        mount_point = root / name
        if mount_point.is_dir() and not mount_point.is_symlink() and not any(mount_point.iterdir()):
            mount_point.rmdir()
    return root


def copying(copy: Path) -> bool:
    """Whether ``copy`` is a partial copy (``rootfs-<id>.partial-<pid>``) whose process is still
    making it."""
    _, sep, pid = copy.name.rpartition(PARTIAL)
    if not sep or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def remove_stale(cache: Path = CACHE) -> list[Path]:
    """Remove the copies whose image podman no longer holds, and the partial copies no live process
    is making (one that died mid-copy left its own); returns them."""
    removed = []
    for copy in sorted(cache.glob("rootfs-*")):
        if copying(copy):
            continue
        ident, partial, _ = copy.name.removeprefix("rootfs-").partition(".partial")
        if partial or subprocess.run(["podman", "image", "exists", ident], capture_output=True).returncode:
            shutil.rmtree(copy, ignore_errors=True)
            removed.append(copy)
    return removed


def prepare(image: str | None = None, cache: Path = CACHE) -> Path:
    image = image or image_name()
    ident = image_id(image)
    root = cache / f"rootfs-{ident[:12]}"
    if (root / DONE).is_file():
        return use_host_pseudo_filesystems(root)
    remove_stale(cache)
    mounted = subprocess.run(["podman", "image", "mount", image], capture_output=True, text=True,
                             check=True).stdout.strip()
    # A copy of this process's own: two processes preparing the same image at once (the gate and
    # a `make board-model` beside it) once shared one partial copy, and each removed the other's.
    partial = root.with_name(f"{root.name}{PARTIAL}{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        subprocess.run(["cp", "-a", f"{mounted}/.", str(partial)], check=True)
    finally:
        subprocess.run(["podman", "image", "unmount", image], capture_output=True)
    relativize_symlinks(partial)
    use_host_pseudo_filesystems(partial)
    (partial / DONE).write_text(json.dumps({"image": image, "id": ident}) + "\n")
    if root.exists() and not (root / DONE).is_file():
        shutil.rmtree(root, ignore_errors=True)
    try:
        partial.rename(root)
    except OSError:  # another process put its complete copy there first: use that one
        shutil.rmtree(partial, ignore_errors=True)
        if not (root / DONE).is_file():
            raise
    return root


def site_packages(root: Path) -> Path:
    python = lock()["arch"]["riscv64"]["python"]
    return root / VENV / "lib" / f"python{python}" / "site-packages"


def check(root: Path) -> dict:
    """The rootfs's torch, interpreter and kernel library against the lock; returns what it
    found. Counts of another torch or another kernel build would be silently different."""
    arch = lock()["arch"]["riscv64"]
    python = root / "usr" / "bin" / f"python{arch['python']}"
    if not python.is_file():
        raise ToolError(f"{root}: no {python.relative_to(root)}; the lock pins Python "
                        f"{arch['python']} for riscv64: rebuild the image (make image-runtime ARCH=riscv64)")
    version_file = root / "usr/lib/python3/dist-packages/torch/version.py"
    torch_version = None
    if version_file.is_file():
        for line in version_file.read_text().splitlines():
            if line.startswith("__version__"):
                torch_version = line.split("=", 1)[1].strip().strip("'\"")
    want = arch["torch"]["version"]
    if not torch_version or not torch_version.startswith(want):
        raise ToolError(f"{root}: torch {torch_version} does not match images/lock.toml "
                        f"[arch.riscv64.torch] version {want}: rebuild the image")
    manifest_path = site_packages(root) / "sglang_rvv" / "kernels" / "lib" / "kernels.json"
    if not manifest_path.is_file():
        raise ToolError(f"{root}: no kernel library manifest {manifest_path.relative_to(root)}: "
                        "the image was built without the RVV kernels; rebuild it")
    manifest = json.loads(manifest_path.read_text())
    want_src = arch["kernels"]["source_sha256"]
    if manifest.get("source_sha256") != want_src:
        raise ToolError(f"{manifest_path}: kernel sources {manifest.get('source_sha256')} differ from "
                        f"images/lock.toml [arch.riscv64.kernels] source_sha256 {want_src}: rebuild "
                        "the image from this tree")
    return {"python": str(python.relative_to(root)), "torch": torch_version,
            "kernels": {k: manifest[k] for k in sorted(manifest) if isinstance(manifest[k], str)}}
