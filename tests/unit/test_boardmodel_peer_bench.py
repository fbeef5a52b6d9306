"""make reproduce's peer step, the controller's half (python -m sglang_rvv.boardmodel.peer_bench):
the llama-bench command lines the board runs, the builds packed once under their inputs' digest,
and each missing input one line naming the command that makes it. No build is needed: the builds
here are directories with a peer.json, and no binary runs (tests/peer_tools/test_peer_bench.py runs them)."""

from __future__ import annotations

import json
import tarfile

import pytest

from sglang_rvv.boardmodel import peer_bench, peer_build, peer_models, tool

BOARD = "/var/lib/sglang-rvv/peer"


def fake_build(root, variant: str, inputs: str = "one") -> None:
    path = root / f"llama.cpp-{variant}"
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "llama-bench").write_text("")
    (path / "sysroot" / "lib").mkdir(parents=True)
    (path / "peer.json").write_text(json.dumps({"sdist_sha256": tool.lock()["peer"]["llama_cpp"]["sha256"],
                                                "inputs": inputs}))


@pytest.fixture
def peer_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_RVV_PEER_DIR", str(tmp_path))
    (tmp_path / "gguf").mkdir()

    def model_file(shape_name, shape, fmt, seed=0, log=None):
        path = tmp_path / "gguf" / f"{shape_name}-{fmt}.gguf"
        path.write_bytes(b"GGUF")
        return path

    monkeypatch.setattr(peer_models, "model_file", model_file)
    return tmp_path


def test_the_board_runs_each_build_through_its_own_loader_pinned_when_asked():
    argv = peer_bench.command(f"{BOARD}/b", [f"{BOARD}/gguf/a.gguf", f"{BOARD}/gguf/b.gguf"], "rvv",
                              peer_bench.Threads(4, "0-3"), extra=["-r", "3"])
    assert argv == ["taskset", "-c", "0-3", f"{BOARD}/b/sysroot/lib/ld-linux-riscv64-lp64d.so.1",
                    "--library-path", f"{BOARD}/b/sysroot/lib:{BOARD}/b/bin", f"{BOARD}/b/bin/llama-bench",
                    "-m", f"{BOARD}/gguf/a.gguf", "-m", f"{BOARD}/gguf/b.gguf", "-p", "128", "-n", "128", "-t", "4",
                    "--repack", "1,0", "-r", "3", "-o", "json"]
    ime = peer_bench.command("b", ["a.gguf"], "ime", peer_bench.Threads(8), prompt=8, gen=4)
    assert ime[0] == "b/sysroot/lib/ld-linux-riscv64-lp64d.so.1"
    assert ime[-10:] == ["-p", "8", "-n", "4", "-t", "8", "--repack", "1", "-o", "json"]


@pytest.mark.parametrize(("spec", "threads"), [("4:0-3", peer_bench.Threads(4, "0-3")), ("8", peer_bench.Threads(8))])
def test_a_thread_count_and_its_cpus(spec, threads):
    assert peer_bench.Threads.parse(spec) == threads


def test_the_plan_packs_each_build_once_and_renders_every_run(peer_dir, capsys):
    fake_build(peer_dir, "rvv")
    fake_build(peer_dir, "ime")
    argv = ["--shape", "tiny", "--formats", "Q4_0", "Q8_0", "--builds", "ime", "rvv", "--board-dir", BOARD + "/"]
    assert peer_bench.main(argv) == 0
    plan = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["build"], r["threads"], r["cpus"], r["paths"]) for r in plan["runs"]] == [
        ("ime", 4, "0-3", {"1": "ime"}), ("ime", 8, "", {"1": "ime"}),
        ("rvv", 4, "0-3", {"1": "repack", "0": "vec_dot"}), ("rvv", 8, "", {"1": "repack", "0": "vec_dot"})]
    assert [m["board_path"] for m in plan["models"]] == [f"{BOARD}/gguf/tiny-Q4_0.gguf", f"{BOARD}/gguf/tiny-Q8_0.gguf"]
    rvv = plan["builds"]["rvv"]
    assert rvv["dir"].startswith(f"{BOARD}/llama.cpp-rvv-") and rvv["archive"].endswith(".tar.gz")
    assert plan["runs"][2]["argv"][3] == f"{rvv['dir']}/{peer_bench.LOADER}"
    with tarfile.open(rvv["archive"]) as archive:
        assert f"{rvv['dir'].rsplit('/', 1)[1]}/bin/llama-bench" in archive.getnames()
    mtime = (peer_dir / "ship" / rvv["archive"].rsplit("/", 1)[1]).stat().st_mtime_ns
    assert peer_bench.main(argv) == 0  # the same build: the same archive, not packed again
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["builds"] == plan["builds"] and (peer_dir / "ship" / rvv["archive"].rsplit("/", 1)[1]).stat(
    ).st_mtime_ns == mtime
    (peer_dir / "llama.cpp-rvv" / "peer.json").write_text(json.dumps(
        {"sdist_sha256": tool.lock()["peer"]["llama_cpp"]["sha256"], "inputs": "two"}))
    assert peer_bench.main(argv) == 0  # another build: another directory on the board
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["builds"]["rvv"]["dir"] != rvv["dir"]


@pytest.mark.parametrize(("argv", "needle"), [
    (["--builds", "ime", "rvv"], "missing peer build: {dir}/llama.cpp-ime has no peer.json; build it with "
                                 "peer/build.sh ime (make peer-build)"),
    (["--builds", "host"], "unknown peer build 'host' for llama-bench: choose from ime, rvv"),
    (["--builds", "rvv", "--threads", "four"], "--threads 'four': give N or N:CPUS (e.g. 4:0-3 8)"),
    (["--builds", "rvv", "--shape", "qwen9"], "no model shape 'qwen9': choose tiny or one of images/lock.toml"),
])
def test_a_missing_build_or_a_bad_argument_is_one_line_and_nothing_is_packed(peer_dir, capsys, argv, needle):
    fake_build(peer_dir, "rvv")
    assert peer_bench.main([*argv, "--board-dir", BOARD]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("peer-bench: error: ") and needle.format(dir=peer_dir) in lines[0]
    assert not (peer_dir / "ship").exists()


def test_a_build_without_llama_bench_names_the_rebuild(peer_dir, capsys):
    fake_build(peer_dir, "rvv")
    (peer_dir / "llama.cpp-rvv" / "bin" / "llama-bench").unlink()
    assert peer_bench.main(["--builds", "rvv", "--board-dir", BOARD]) == 2
    assert "the peer's rvv build has no llama-bench" in capsys.readouterr().err
    assert peer_build.peer_dir() == peer_dir
