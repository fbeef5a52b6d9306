"""The riscv64 appliance of the default model (SmolLM2-135M-Instruct) deployed by Ansible on an
emulated board: this host, whose podman runs the riscv64 image under qemu-user (binfmt_misc)
where a board runs it natively. The image is made on the controller (`make image-archive
ARCH=riscv64`) and handed in with podman save/load, not rebuilt: build.yml loads the archive,
deploy.yml serves it with the service role (compose, the board's CPU model for qemu), both change
nothing on a second run, and the host checks pass (the image's arch and labels against the lock,
the container's machine, a served completion). The served riscv64 appliance (flag on, the RVV
kernels) gives the amd64 appliance's greedy answer to the capital question in the model's ChatML
(naming Paris), and every projection of it takes the packed route. An archive of another commit
or arch, or none, is refused before anything is copied.

The controller and the "board" share this host's podman storage, so the image's tag is removed
before build.yml runs (the load puts it back; the fixture restores it if a run failed).
Timings under qemu are printed for CI planning only; they say nothing about the board.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import time
import urllib.request

import pytest
from ansible_support import BIN, REPO, flat, host_checks_pass, inventory, playbook, recap, succeeded
from image_support import HOST_ARCH, Container, free_port, head_commit, image_id, lock_get, run

from sglang_rvv.bench.serving import linear_calls
from sglang_rvv.launch.process import SGLangServer
from support import CAPITAL_PROMPT, assert_same_greedy, greedy_reply

TARGET = "emulated-riscv64-board"
PROJECT = "sglang-rvv-emulated-board"  # its own compose project: the lanes' appliances run beside it
MODEL = lock_get("models.default")
REQUEST_TIMEOUT = 1800  # one request under qemu (never a speed)
# The capital question as one user turn of the model's ChatML (support.CAPITAL_PROMPT, without
# the chat template's default system turn), 8 greedy tokens ("The capital of France is Paris." is
# 7): under qemu every prompt or generated token of this model is slow (its RVV kernels' vector
# instructions are emulated one by one), so the shorter prompt saves minutes.
ANSWER_TOKENS = 8
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """`make image-archive ARCH=riscv64 CACHE=cold` (the default model): (archive, image name, its id)."""
    if os.geteuid() != 0:
        pytest.fail("deploying needs root and rootful podman: run images/scripts/podman-setup.sh")
    # make inside `make test` prints "make[1]: Leaving directory ..." last unless told not to.
    made = run(["make", "--no-print-directory", "image-archive", "ARCH=riscv64", "CACHE=cold"], timeout=3600,
               log=tmp_path_factory.mktemp("logs") / "make-image-archive-riscv64.log")
    path = made.stdout.strip().splitlines()[-1]
    name = f"localhost/sglang-rvv:{lock_get('app.version')}-{MODEL}-riscv64"
    return path, name, image_id(name)


@pytest.fixture(scope="module")
def deploy(archive, tmp_path_factory):
    path, name, archived = archive
    work = tmp_path_factory.mktemp("deploy-riscv64")
    port = free_port()
    variables = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "/usr/bin/python3",
        "sglang_rvv_arch": "riscv64",
        "sglang_rvv_cache": "cold",  # the rvv provider compiles nothing for its packed calls: no warm riscv64 image
        "sglang_rvv_src_dir": str(work / "src"),
        "sglang_rvv_port": port,
        "sglang_rvv_build_image_archive": path,
        "sglang_rvv_service_project": PROJECT,
        "sglang_rvv_service_compose": str(BIN / "podman-compose"),
        "sglang_rvv_infra_checks": ["service"],
    }
    hosts = inventory(work / "inventory.yml", {TARGET: variables})
    subprocess.run(["podman", "untag", name, name], check=True, capture_output=True)
    try:
        runs = {"build": playbook(hosts, "build.yml")}
        if runs["build"].returncode == 0:
            runs["build again"] = playbook(hosts, "build.yml")
            runs["deploy"] = playbook(hosts, "deploy.yml")
            if runs["deploy"].returncode == 0:
                runs["deploy again"] = playbook(hosts, "deploy.yml")
        yield hosts, port, runs, work
    finally:
        subprocess.run([REPO / "images/scripts/compose.sh", "down"], capture_output=True, timeout=300,
                       env={**os.environ, "PODMAN_COMPOSE": str(BIN / "podman-compose"), "SGLANG_RVV_PROJECT": PROJECT})
        if subprocess.run(["podman", "image", "exists", name]).returncode != 0:
            # a failed load: the other tests of this lane want the image
            subprocess.run(["podman", "tag", archived, name], capture_output=True)


def test_build_loads_the_archive_instead_of_building(archive, deploy):
    path, name, archived = archive
    _, _, runs, work = deploy
    out = flat(succeeded(runs, "build").stdout)
    assert f"{name} ({archived[:12]}, commit {head_commit()[:12]}) loaded from {path} on {TARGET}" in out
    assert "Start make image" not in out
    assert image_id(name) == archived
    assert not list((work / "image-archives").iterdir()), "the target's copy of the archive is left behind"
    again = succeeded(runs, "build again")
    assert f"{name} ({archived[:12]}, commit {head_commit()[:12]}) already on {TARGET}" in flat(again.stdout)
    assert recap(again.stdout)[TARGET]["changed"] == 0, again.stdout[-4000:]


def test_the_riscv64_appliance_serves_under_qemu(archive, deploy):
    _, name, archived = archive
    _, port, runs, _ = deploy
    out = flat(succeeded(runs, "deploy").stdout)
    assert f"{name} serves on 127.0.0.1:{port} (compose)" in out and "returned 4 tokens" in out
    listed = subprocess.run(["podman", "ps", "-q", "--filter", f"label=io.podman.compose.project={PROJECT}"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert len(listed) == 1, listed
    (container,) = json.loads(subprocess.run(["podman", "inspect", listed[0]], capture_output=True, text=True,
                                             check=True).stdout)
    assert container["Image"] == archived
    config = container["Config"]
    assert f"QEMU_CPU={lock_get('arch.riscv64.qemu_cpu')}" in config["Env"]  # the K1's vector unit
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
        assert 'provider="rvv"' in response.read().decode()


def test_the_riscv64_answer_is_the_amd64_appliances(archive, deploy, tmp_path):
    """The same greedy answer up to a bf16 near tie, naming Paris: the RVV kernels under qemu
    against this host's amd64 appliance, both served by SGLang with the flag."""
    _, port, runs, _ = deploy
    succeeded(runs, "deploy")
    # The amd64 model image of the default model (base and runtime shared with the other tests).
    run(["make", "image", f"ARCH={HOST_ARCH}", "CACHE=cold"], timeout=3600, log=tmp_path / "make-image.log")
    amd64 = Container(f"localhost/sglang-rvv:{lock_get('app.version')}-{MODEL}-{HOST_ARCH}")
    try:
        amd64.wait_healthy()
        _, want = greedy_reply(SGLangServer(MODEL, port=amd64.port, log_path="-"), CAPITAL_PROMPT, ANSWER_TOKENS,
                               ignore_eos=False)
    finally:
        amd64.remove()
    riscv64 = SGLangServer(MODEL, port=port, log_path="-")
    began = time.monotonic()
    answer, got = greedy_reply(riscv64, CAPITAL_PROMPT, ANSWER_TOKENS, timeout=REQUEST_TIMEOUT, ignore_eos=False)
    print(f"riscv64 appliance, answer {answer!r} in {time.monotonic() - began:.0f} s (qemu; not a speed)")
    # The turn may end (<|im_end|>) before ANSWER_TOKENS: the same tokens end at the same step.
    shared = min(len(got), len(want))
    assert_same_greedy(got[:shared], want[:shared], tokens=shared)
    if [t for t, _, _ in got[:shared]] == [t for t, _, _ in want[:shared]]:
        assert len(got) == len(want), (got, want)
    assert "Paris" in answer, answer
    # Every projection of its 30 layers and lm_head streamed through the rvv provider's packed kernels.
    calls = linear_calls(riscv64)
    packed = {key.split("/")[0] for key, count in calls.items() if key.split("/")[1].startswith("packed_") and count}
    assert packed == set(PROJECTIONS), calls
    # None through an Inductor-compiled callable: this cold image's start compiled nothing for them.
    assert not {key.split("/")[1] for key, count in calls.items() if count} & {"packed_compiled", "row_major_compiled"}


def test_a_second_deploy_changes_nothing(deploy):
    _, _, runs, _ = deploy
    assert recap(succeeded(runs, "deploy again").stdout)[TARGET]["changed"] == 0


def test_host_checks_pass_for_the_riscv64_service(deploy):
    hosts, _, runs, _ = deploy
    succeeded(runs, "deploy")
    host_checks_pass(hosts, 5)


def _fake_archive(path, tag: str, arch: str, revision: str) -> str:
    """A docker-archive's manifest and image config, which is all the build role reads before it
    copies anything."""
    config = json.dumps({"architecture": arch, "config": {"Labels": {"org.opencontainers.image.revision": revision}}})
    digest = "ab" * 32
    members = {"manifest.json": json.dumps([{"Config": f"{digest}.json", "RepoTags": [tag], "Layers": []}]),
               f"{digest}.json": config}
    with tarfile.open(path, "w") as tar:
        for member, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


@pytest.mark.parametrize("case", ["none", "not an archive", "another commit", "another arch"])
def test_a_wrong_archive_is_refused_before_it_is_copied(archive, deploy, tmp_path, case):
    _, name, archived = archive
    hosts, _, runs, work = deploy
    succeeded(runs, "build")
    amd64 = name.replace("-riscv64", "-amd64")
    (tmp_path / "notes.tar").write_text("not a tar file\n")
    path = {"none": str(tmp_path / "missing.tar"), "not an archive": str(tmp_path / "notes.tar"),
            "another commit": _fake_archive(tmp_path / "old.tar", name, "riscv64", "0" * 40),
            "another arch": _fake_archive(tmp_path / "amd64.tar", amd64, "amd64", head_commit())}[case]
    result = playbook(hosts, "build.yml", "-e", f"sglang_rvv_build_image_archive={path}")
    assert result.returncode == 2, result.stdout[-4000:]
    out = flat(result.stdout)
    expected = {
        "none": f"{path} is not a file on the controller: make it with `make image-archive ARCH=riscv64",
        "not an archive": f"{path} is not a `podman save` archive (docker-archive: no manifest.json; tar says",
        "another commit": f"holds {name} (riscv64, built from commit 000000000000), but this run ships {name} "
                          f"(riscv64) of commit {head_commit()[:12]}: run `make image-archive ARCH=riscv64 CACHE=cold` "
                          "at that commit",
        "another arch": f"holds {amd64} (amd64, built from commit {head_commit()[:12]}), but this run ships {name}",
    }[case]
    assert expected in out
    assert "Copy the archive" not in out and image_id(name) == archived
    assert not list((work / "image-archives").iterdir())
