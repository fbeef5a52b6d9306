"""llama.cpp's own benchmark on a board, beside the appliance's (``make reproduce``):
the controller's half. It checks the peer's builds (peer/build.sh), makes the GGUF files of the
benchmarked model from the same seeded weights the board model counts (:mod:`.peer_models`), packs
each build once into an archive named by its ``peer.json``, and renders every ``llama-bench``
command line the board runs, as the paths will be there. The role ships the files, runs the
commands and writes their JSON into the run's ``peer-bench.json``; the report reads it
(:mod:`sglang_rvv.bench.report.peer_bench`).

    python -m sglang_rvv.boardmodel.peer_bench --shape qwen3-0.6b --formats Q4_0 Q8_0 \\
        --builds rvv --threads 4:0-3 8 --board-dir /var/lib/sglang-rvv/peer

prints one JSON object (the plan) as its last line on stdout; a missing build, an unknown format
or a shape without a GGUF writer is one line on stderr, naming the command that fixes it, exit 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from . import peer_build, peer_models
from . import run as count_run
from .tool import ToolError

# Each build's llama-bench --repack values: the IME build only with its extra buffer types on (the
# IME kernels are one), the plain build at its default repacked gemv and at vec_dot, the path the
# published plain-RVV run took.
REPACK = {"ime": (1,), "rvv": (1, 0)}
LOADER = "sysroot/lib/ld-linux-riscv64-lp64d.so.1"
PROMPT, GEN = 128, 128


@dataclass(frozen=True)
class Threads:
    """A thread count, and the CPUs it is pinned to with taskset ("" for none)."""

    count: int
    cpus: str = ""

    @classmethod
    def parse(cls, spec: str) -> Threads:
        count, _, cpus = spec.partition(":")
        if not count.isdigit() or int(count) < 1:
            raise ToolError(f"--threads {spec!r}: give N or N:CPUS (e.g. 4:0-3 8)")
        return cls(int(count), cpus)


def path_name(build: str, repack: int) -> str:
    """The weight path a build runs at a --repack value, named as :mod:`.compare` names them."""
    return "ime" if build == "ime" else "repack" if repack else "vec_dot"


def archive_name(build: peer_build.Build) -> str:
    """The build's directory name on the board: its variant and a digest of what it was built from."""
    digest = hashlib.sha256((build.path / "peer.json").read_bytes()).hexdigest()[:12]
    return f"llama.cpp-{build.variant}-{digest}"


def pack(build: peer_build.Build, ship_dir: Path) -> Path:
    """``ship_dir/NAME.tar.gz`` of the whole build (bin/, sysroot/, peer.json), made once."""
    name = archive_name(build)
    out = ship_dir / f"{name}.tar.gz"
    if not out.is_file():
        ship_dir.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}")
        with tarfile.open(tmp, "w:gz") as archive:
            archive.add(build.path, arcname=name)
        tmp.rename(out)
    return out


def command(build_dir: str, models: list[str], build: str, threads: Threads, prompt: int = PROMPT,
            gen: int = GEN, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """One llama-bench run on the board: every model, this build's --repack values, JSON on stdout.
    The build's own loader and runtime run it, so the board needs no C++ runtime of its own."""
    argv = ["taskset", "-c", threads.cpus] if threads.cpus else []
    argv += [f"{build_dir}/{LOADER}", "--library-path", f"{build_dir}/sysroot/lib:{build_dir}/bin",
             f"{build_dir}/bin/llama-bench"]
    for model in models:
        argv += ["-m", model]
    return [*argv, "-p", str(prompt), "-n", str(gen), "-t", str(threads.count),
            "--repack", ",".join(map(str, REPACK[build])), *extra, "-o", "json"]


def _log(message: str) -> None:
    print(f"peer-bench: {message}", file=sys.stderr)


def plan(shape: str, formats: list[str], builds: list[str], threads: list[Threads], board_dir: str,
         ship_dir: Path, prompt: int = PROMPT, gen: int = GEN, extra: tuple[str, ...] = ()) -> dict:
    """Check the builds and make the GGUF files (else a ToolError naming the fix), pack the builds,
    and render the board's runs."""
    unknown = [b for b in builds if b not in REPACK]
    if unknown:
        raise ToolError(f"unknown peer build {unknown[0]!r} for llama-bench: choose from {', '.join(REPACK)}")
    found = {name: peer_build.require(name) for name in builds}
    for build in found.values():
        build.binary("llama-bench")
    shape_dict = count_run.shape(shape)
    files = {fmt: peer_models.model_file(shape, shape_dict, fmt, log=_log) for fmt in formats}
    models = [{"format": fmt, "file": path.name, "source": str(path), "board_path": f"{board_dir}/gguf/{path.name}"}
              for fmt, path in files.items()]
    shipped = {name: {"archive": str(pack(build, ship_dir)), "dir": f"{board_dir}/{archive_name(build)}"}
               for name, build in found.items()}
    runs = [{"build": name, "paths": {str(r): path_name(name, r) for r in REPACK[name]}, "threads": t.count,
             "cpus": t.cpus,
             "argv": command(shipped[name]["dir"], [m["board_path"] for m in models], name, t, prompt, gen, extra)}
            for name in builds for t in threads]
    return {"shape": shape, "prompt": prompt, "gen": gen, "board_dir": board_dir, "builds": shipped,
            "models": models, "runs": runs}


def parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.boardmodel.peer_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-0.6b", help="the board model's shape of the benchmarked model")
    parser.add_argument("--formats", nargs="+", default=["Q4_0", "Q8_0"], help="llama-quantize types")
    parser.add_argument("--builds", nargs="+", default=["rvv"],
                        help=f"peer builds, of {', '.join(REPACK)} (default: rvv)")
    parser.add_argument("--threads", nargs="+", type=str, default=["4:0-3", "8"],
                        help="thread counts, each N or N:CPUS pinned with taskset (default: 4:0-3 8)")
    parser.add_argument("--prompt", type=int, default=PROMPT, help="llama-bench -p (default 128)")
    parser.add_argument("--gen", type=int, default=GEN, help="llama-bench -n (default 128)")
    parser.add_argument("--extra", default="", help="more llama-bench arguments, space separated (e.g. '-r 3')")
    parser.add_argument("--board-dir", required=True, help="where the board keeps the builds and GGUF files")
    parser.add_argument("--ship-dir", type=Path, default=peer_build.peer_dir() / "ship",
                        help="where the builds' archives are kept here (default .cache/peer/ship)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    try:
        threads = [Threads.parse(spec) for spec in args.threads]
        result = plan(args.shape, args.formats, args.builds, threads, args.board_dir.rstrip("/"), args.ship_dir,
                      args.prompt, args.gen, tuple(args.extra.split()))
    except ToolError as error:
        print(f"peer-bench: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
