"""The amd64 serving images: compose up with a real completion, testinfra on the running
container, warm versus cold Inductor cache, refusals, and a rebuild that reproduces the contents.

The rebuild test comes last in this file: it replaces the base, runtime and model images.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
import testinfra
from image_support import (
    HOST_ARCH,
    LOCK_PY,
    REPO,
    Container,
    completion,
    compose_container,
    free_port,
    head_commit,
    image_id,
    lock_get,
    run,
)

CACHE_VOLUME = "/var/cache/sglang-rvv/inductor"
MANIFEST_IN_IMAGE = "/usr/share/sglang-rvv/inductor-warm/sglang_rvv_cache_manifest.json"
WARMUP_RE = re.compile(r"warm-up: (\d+) shape keys in [\d.]+ s, (\d+) Inductor compiles, (\d+) cache hits")
SKIPPED_RE = re.compile(r"\((\d+) more keys routed row-major and (\d+) eager by the cached route table, not loaded\)")


def _in_image(image: str, *command: str) -> str:
    return subprocess.run(["podman", "run", "--rm", "--no-healthcheck", "--entrypoint", command[0], image,
                           *command[1:]], check=True, capture_output=True, text=True).stdout


def _checkout_revision() -> str:
    """The commit this checkout is, "-dirty" when its work tree differs (as the build labels it)."""
    head = head_commit()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], check=True, capture_output=True,
                           text=True).stdout.strip()
    return head + ("-dirty" if dirty else "")


def test_make_up_serves_a_completion_and_the_container_is_what_the_lock_says(amd64_images, build_logs):
    # A kept image must name the commit it was built from, even when an older commit built
    # the same files (the revision is one of the inputs its kept-or-rebuilt label digests).
    revision = subprocess.run(["podman", "image", "inspect", "--format",
                               '{{index .Labels "org.opencontainers.image.revision"}}', amd64_images["model"]],
                              check=True, capture_output=True, text=True).stdout.strip()
    assert revision == _checkout_revision()
    port = free_port()
    up = run(["make", "up", f"ARCH={HOST_ARCH}", "MODEL=tiny-llama", f"PORT={port}"], timeout=900,
             log=build_logs / "make-up.log")
    try:
        assert f"curl http://127.0.0.1:{port}/v1/completions" in up.stdout
        reply = completion(port)
        assert reply["usage"]["completion_tokens"] == 8 and reply["choices"][0]["text"]

        container = compose_container()
        host = testinfra.get_host(f"podman://{container}")
        assert host.check_output("id -u") == "10001"
        assert host.check_output("id -un") == "sglang"
        versions = host.check_output(
            "python -c 'import importlib.metadata as m, torch, sglang_rvv; "
            "print(torch.__version__, m.version(\"sglang\"), sglang_rvv.__version__)'")
        assert versions.split() == [lock_get(f"arch.{HOST_ARCH}.torch.version"), lock_get("sglang.version"),
                                    lock_get("app.version")]
        pinned = json.loads(lock_get("models.tiny-llama.sha256"))
        actual = dict(line.split()[::-1] for line in host.check_output(
            "cd /models/model && sha256sum *").splitlines())
        assert actual == pinned
        assert host.run("touch /opt/x").rc != 0, "the root filesystem must be read-only"
        assert host.check_output("grep NoNewPrivs /proc/self/status").split() == ["NoNewPrivs:", "1"]

        ports = subprocess.run(["podman", "port", container], check=True, capture_output=True, text=True).stdout
        assert ports.strip() == f"30000/tcp -> 127.0.0.1:{port}", ports
        local = testinfra.get_host("local://")
        assert local.socket(f"tcp://127.0.0.1:{port}").is_listening
        assert not local.socket(f"tcp://0.0.0.0:{port}").is_listening
    finally:
        run(["make", "down"], timeout=300)


def _cache_dir() -> str:
    """The container's Inductor cache directory (one per cache key, on the cache volume)."""
    return f"/var/cache/sglang-rvv/inductor/{lock_get(f'arch.{HOST_ARCH}.inductor_cache_key')}"


def test_the_warm_image_loads_every_key_from_its_cache_and_compiles_nothing(amd64_images):
    manifest = json.loads(_in_image(amd64_images["warm"], "cat", MANIFEST_IN_IMAGE))
    cold_compiles = manifest["warmup"]["compiled"]
    assert cold_compiles == len(manifest["shape_keys"]) > 0  # the build-time warm-up started from nothing

    container = Container(amd64_images["warm"], podman_args=(
        "--read-only", "--tmpfs", "/tmp", "-v", CACHE_VOLUME))  # a fresh anonymous volume, as compose's
    try:
        seconds = container.wait_healthy()
        logs = container.logs()
        assert "Inductor cache: artifact-warm" in logs
        keys, compiles, hits = map(int, WARMUP_RE.search(logs).groups())
        skipped = SKIPPED_RE.search(logs)
        row_major, eager = map(int, skipped.groups()) if skipped else (0, 0)
        print(f"warm start: healthy after {seconds:.0f} s; {keys} keys, {compiles} compiles, {hits} cache hits, "
              f"{row_major} routed row-major and {eager} eager, not loaded (the cold build-time warm-up compiled "
              f"{cold_compiles})")
        # The route table measured at build time came with the cache: nothing is re-measured, and
        # the keys it routes row-major or eager are not even loaded.
        report = json.loads(container.exec("cat", f"{_cache_dir()}/sglang_rvv_report.json"))
        table = report["warmup"]["route_table"]
        assert table and {entry["source"] for entry in table} == {"cache"}, table
        assert row_major == sum(entry["route"] == "row_major" for entry in table)
        assert eager == sum(entry["route"] == "eager" for entry in table)
        assert keys + row_major + eager == len(manifest["shape_keys"])
        assert compiles < cold_compiles and compiles == 0
        assert hits == keys
        assert completion(container.port)["usage"]["completion_tokens"] == 8
    finally:
        container.remove()


def test_a_tampered_manifest_is_rejected_and_the_start_is_cold(amd64_images, tmp_path):
    manifest = json.loads(_in_image(amd64_images["warm"], "cat", MANIFEST_IN_IMAGE))
    manifest["torch_version"] = "2.0.0+tampered"
    tampered = tmp_path / "manifest.json"
    tampered.write_text(json.dumps(manifest))
    container = Container(amd64_images["warm"], podman_args=("-v", f"{tampered}:{MANIFEST_IN_IMAGE}:ro"))
    try:
        container.wait_healthy()
        logs = container.logs()
        assert "warning: Inductor cache: artifact-cold (prewarmed cache rejected, torch_version: cache " \
               "'2.0.0+tampered'" in logs
        # Nothing was copied: the load-time warm-up compiled every key from nothing.
        keys, compiles, hits = map(int, WARMUP_RE.search(logs).groups())
        assert "files copied" not in logs and compiles == keys > 0 and hits == 0
        report = json.loads(container.exec("cat", f"{_cache_dir()}/sglang_rvv_report.json"))
        assert report["cache_state"] == "artifact-cold"
        assert {entry["source"] for entry in report["warmup"]["route_table"]} == {"measured"}
        assert completion(container.port)["usage"]["completion_tokens"] == 8
    finally:
        container.remove()


@pytest.mark.parametrize("podman_args,message", [
    (("-e", "SGLANG_RVV_MODEL_DIR=/nowhere"),
     "model directory /nowhere does not exist: mount a checkpoint there (-v ./my-model:/nowhere:ro) "
     "or set SGLANG_RVV_MODEL_DIR"),
    (("--read-only", "--tmpfs", "/tmp"),
     "cannot create /var/cache/sglang-rvv/inductor/{key} (Read-only file system): mount a volume writable "
     "by uid 10001 on /var/cache/sglang-rvv/inductor"),
])
def test_the_entrypoint_refuses_bad_setups_in_one_line(amd64_images, podman_args, message):
    result = subprocess.run(["podman", "run", "--rm", "--no-healthcheck", *podman_args, amd64_images["model"]],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 64
    lines = [line for line in result.stderr.splitlines() if "systemd" not in line]
    key = lock_get(f"arch.{HOST_ARCH}.inductor_cache_key")
    assert lines == [f"sglang-rvv entrypoint: error: {message.format(key=key)}"]


@pytest.mark.parametrize("seccomp,refused", [((), True), (("--security-opt", "seccomp=unconfined"), False)])
def test_the_board_counters_step_runs_in_the_model_image_as_reproduce_runs_it(amd64_images, tmp_path, seccomp,
                                                                              refused):
    """The reproduce role's counters step (its command, the lock mounted since the image has none):
    podman's default seccomp profile refuses perf_event_open, and the file says so and how to fix it;
    without seccomp (what the role runs) the counters are read. The task clock stands in for the
    board's instructions and cycles: this host has no hardware PMU."""
    tmp_path.chmod(0o777)
    result = subprocess.run(["podman", "run", "--rm", "--init", "--no-healthcheck", "--network=none", "--user",
                             "10001:10001", "--entrypoint", "python3", *seccomp,
                             "-v", f"{REPO / 'images' / 'lock.toml'}:/lock.toml:ro", "-v", f"{tmp_path}:/results",
                             amd64_images["model"], "-m", "sglang_rvv.boardmodel.counters", "--lock", "/lock.toml",
                             "--run-dir", "/results", "--shapes", "tiny", "--layouts", "--events", "task_clock_ns"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "board-counters.json").read_text())
    step = data["workloads"][0]["per_token"]
    if refused:
        assert data["unavailable"].startswith("perf_event_open(task_clock_ns): refused (EPERM): ")
        assert "podman run --security-opt seccomp=unconfined" in data["unavailable"]
        assert "task_clock_ns" not in step and step["seconds"] > 0
    else:
        assert data["unavailable"] is None and step["task_clock_ns"] > 0


def _content(image: str) -> dict:
    script = REPO / "images" / "scripts" / "content-manifest.py"
    out = subprocess.run(["podman", "run", "--rm", "--no-healthcheck", "--network=none", "--entrypoint", "python3",
                          "-v", f"{script}:/tmp/content-manifest.py:ro", image, "/tmp/content-manifest.py"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def _tree(root: Path) -> dict[str, tuple]:
    """path -> (kind, mode, uid, gid, size, sha256 or link target) for every entry under root."""
    entries = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if stat.S_ISREG(st.st_mode):
            with open(path, "rb") as f:
                what = hashlib.file_digest(f, "sha256").hexdigest()
        else:
            what = os.readlink(path) if path.is_symlink() else ""
        size = 0 if stat.S_ISDIR(st.st_mode) else st.st_size  # a directory's size is the filesystem's
        entries[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid,
                                                st.st_gid, size, what)
    return entries


def _image_differences(old: str, new: str, limit: int = 15) -> list[str]:
    """What differs between two images' labels and file trees: the evidence a failed
    reproducibility check needs (the IDs alone say nothing about where)."""
    la, lb = (json.loads(subprocess.run(["podman", "image", "inspect", "--format", "{{json .Labels}}", image],
                                        check=True, capture_output=True, text=True).stdout) for image in (old, new))
    found = [f"label {k}: {la.get(k)} -> {lb.get(k)}" for k in sorted(la.keys() | lb.keys()) if la.get(k) != lb.get(k)]
    roots = [Path(subprocess.run(["podman", "image", "mount", image], check=True, capture_output=True,
                                 text=True).stdout.strip()) for image in (old, new)]
    try:
        a, b = _tree(roots[0]), _tree(roots[1])
    finally:
        subprocess.run(["podman", "image", "unmount", old, new], capture_output=True)
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    found += [f"{k}: {a.get(k)} -> {b.get(k)}" for k in differ[:limit]]
    if len(differ) > limit:
        found.append(f"... {len(differ) - limit} more paths differ")
    return found


def test_rebuilding_from_scratch_reproduces_the_contents_and_the_image_ids(amd64_images, build_logs):
    image = amd64_images["model"]
    base = f"localhost/sglang-rvv-base:{lock_get(f'arch.{HOST_ARCH}.debian_suite')}-{HOST_ARCH}"
    before, before_id, base_before = _content(image), image_id(image), image_id(base)
    assert before["model"] and before["python_dists"] and before["debian_packages"]
    kept = "localhost/sglang-rvv-test:before-rebuild"  # so the old image can still be compared
    subprocess.run(["podman", "tag", image, kept], check=True)
    try:
        run(["images/scripts/build-base.sh", "--force", HOST_ARCH], timeout=1800, log=build_logs / "rebuild-base.log")
        run(["images/scripts/build-runtime.sh", "--force", HOST_ARCH], timeout=1800,
            log=build_logs / "rebuild-runtime.log")
        run(["images/scripts/build-model.sh", "--force", HOST_ARCH, "tiny-llama"], timeout=900,
            log=build_logs / "rebuild-model.log")
        after, after_id, base_after = _content(image), image_id(image), image_id(base)
        for section in ("debian_packages", "python_dists", "model"):
            differ = {k for k in before[section].keys() | after[section].keys()
                      if before[section].get(k) != after[section].get(k)}
            assert not differ, f"{section} differs after a rebuild: {sorted(differ)[:10]}"
        print(f"base image id {base_before[:12]} -> {base_after[:12]}, "
              f"model image id {before_id[:12]} -> {after_id[:12]}")
        assert base_after == base_before, "the base image is not bit-identical after a rebuild"
        if after_id != before_id:
            pytest.fail("the model image is not bit-identical after a rebuild:\n"
                        + "\n".join(_image_differences(kept, image)))
    finally:
        subprocess.run(["podman", "rmi", kept], capture_output=True)
    assert subprocess.run(["python3", LOCK_PY, "check"], capture_output=True).returncode == 0
