#!/usr/bin/env python3
"""Read and check images/lock.toml, the pins of every sglang-rvv image input.

Standard library only (tomllib: Python >= 3.11), so it runs on the host before
any venv exists. Commands::

    lock.py check                     lock.toml is complete and agrees with the repo
    lock.py refresh                   rewrite the pins that follow from the repo (versions, digests, cache keys)
    lock.py get KEY [KEY...]          a value by dotted path (lists: one item a line)
    lock.py arches                    the arches the lock pins
    lock.py require-image ARCH IMAGE  fails, naming why, unless the lock pins IMAGE for ARCH
    lock.py cache-key ARCH            the Inductor cache key computed from the pins
    lock.py base-inputs ARCH          digest of everything a base image is built from
    lock.py labels ARCH IMAGE         `--label=k=v` lines for podman build
    lock.py export ARCH               the arch's pins as JSON (copied into images)
    lock.py runtime-requirements OUT [ARCH]   what the runtime image installs (hash-pinned)
    lock.py tool-requirements TOOL OUT    a host tool's packages ([tools.TOOL]), hash-pinned
    lock.py download-requirements ARCH OUT   what the wheelhouse downloads for it
    lock.py repacked ARCH             "NAME SOURCE SHA256" per wheel the wheelhouse repacks
    lock.py verify-model NAME DIR     every file of DIR against models.NAME.sha256
    lock.py model-kind NAME           models.NAME.kind (fails, listing the lock's models, for another NAME)
    lock.py kernels-source-sha256     digest of the RVV kernel sources (arch.*.kernels.source_sha256)

Every failure is one line per problem on stderr that names the input, exit 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tomllib
from pathlib import Path

IMAGES_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = IMAGES_DIR.parent
LOCK_PATH = IMAGES_DIR / "lock.toml"
KERNELS_SRC = REPO_DIR / "app" / "sglang_rvv" / "kernels" / "csrc"
LABEL_PREFIX = "io.sglang-rvv"
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
REQUIREMENT_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s*\\?$")
HASH_RE = re.compile(r"--hash=sha256:([0-9a-f]{64})")
# Every image an arch can build; [arch.X].images narrows it (arm64: the gateway only).
IMAGES = ("base", "runtime", "model", "cache", "gateway")


class LockError(Exception):
    """One or more inputs do not match the lock; ``problems`` names each."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def load(path: Path = LOCK_PATH) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def get(lock: dict, dotted: str):
    node = lock
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise LockError([f"{LOCK_PATH.name}: no key '{dotted}' (missing '{part}')"])
        node = node[part]
    return node


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def kernels_source_sha256(directory: Path = KERNELS_SRC) -> str:
    """sha256 of `sha256sum` over every file of ``directory``, sorted by relative path."""
    files = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    listing = "".join(f"{sha256_file(directory / name)}  {name}\n" for name in files)
    return hashlib.sha256(listing.encode()).hexdigest()


def _check_kernels(where: str, kernels: dict, problems: list[str]) -> None:
    for key in ("compiler", "compiler_version", "flags", "march", "march_rvv", "source_sha256"):
        if key not in kernels:
            problems.append(f"{where}.kernels.{key} missing")
    if "source_sha256" in kernels and kernels["source_sha256"] != (actual := kernels_source_sha256()):
        problems.append(f"{where}.kernels.source_sha256 is stale: {KERNELS_SRC.relative_to(REPO_DIR)} gives "
                        f"\"{actual}\" (was \"{kernels['source_sha256']}\"); run lock.py refresh")


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def arch_pins(lock: dict, arch: str) -> dict:
    arches = lock.get("arch", {})
    if arch not in arches:
        raise LockError([f"{LOCK_PATH.name}: no [arch.{arch}] (pinned: {', '.join(sorted(arches))})"])
    return arches[arch]


def arch_of(lock: dict, machine: str) -> str:
    """The lock's arch name (amd64, arm64, riscv64) of a machine name (``uname -m``: x86_64, ...)."""
    for arch, pins in lock["arch"].items():
        if pins.get("machine") == machine:
            return arch
    known = ", ".join(f"{pins.get('machine')} ({arch})" for arch, pins in sorted(lock["arch"].items()))
    raise LockError([f"machine {machine!r} is not one this project builds for: {known}"])


def images(lock: dict, arch: str) -> tuple[str, ...]:
    return tuple(arch_pins(lock, arch).get("images", IMAGES))


def appliance(lock: dict, arch: str) -> bool:
    """Whether the arch pins an appliance (a runtime: torch, an Inductor cache key), not only the gateway."""
    return "runtime" in images(lock, arch)


def require_image(lock: dict, arch: str, image: str) -> None:
    built = images(lock, arch)
    if image not in built:
        raise LockError([f"{LOCK_PATH.name}: arch.{arch} builds the {' and '.join(built)} images only, not {image}: "
                         f"it pins no appliance (no torch, no Inductor cache key); appliances are "
                         f"{', '.join(a for a in lock['arch'] if appliance(lock, a))}"])


def base_inputs(lock: dict, arch: str) -> dict:
    pins = arch_pins(lock, arch)
    return {
        "arch": arch, **lock["base"],
        **{k: pins[k] for k in ("debian_suite", "debian_version", "packages")},
        # only where set, so the amd64 base keeps its inputs digest
        **{k: pins[k] for k in ("apt_check_valid_until",) if k in pins},
    }


def cache_key_inputs(lock: dict, arch: str) -> dict:
    """What compiled Inductor artifacts depend on besides the graph itself."""
    pins = arch_pins(lock, arch)
    return {
        "arch": arch, "isa": pins["isa"], "debian_suite": pins["debian_suite"], "python": pins["python"],
        "torch": pins["torch"], "sglang": lock["sglang"]["version"], "app": lock["app"]["version"],
    }


def cache_key(lock: dict, arch: str) -> str:
    return _digest(cache_key_inputs(lock, arch))[:16]


def _normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirements(path: Path) -> dict[str, tuple[str, list[str]]]:
    """{normalized name: (version, [sha256...])} of a hash-pinned requirements file."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = REQUIREMENT_RE.match(stripped)
        if match:
            current = _normalize(match.group(1))
            entries[current] = (match.group(2), [])
        elif current is not None:
            entries[current][1].extend(HASH_RE.findall(stripped))
    return entries


def _check_shas(where: str, table: dict, problems: list[str]) -> None:
    if not table:
        problems.append(f"{where}: no files pinned")
    for name, value in table.items():
        if not SHA256_RE.match(str(value)):
            problems.append(f"{where}.\"{name}\": not a sha256 ({value!r})")


# Where the app version is written besides pyproject.toml: the package's __version__ (read where
# the package is not installed, e.g. the fleet client's mounted source) and the compose files'
# default image tags. Each must say the same; a bump edits them all.
VERSION_COPIES = {
    "app/sglang_rvv/__init__.py": re.compile(r'^__version__ = "([^"]+)"$', re.M),
    "compose/compose.yaml": re.compile(r"localhost/sglang-rvv:([0-9][^-]*)-"),
    "compose/gateway.yaml": re.compile(r"localhost/sglang-rvv-gateway:([0-9][^-]*)-"),
}


def _version_copies(version: str) -> list[str]:
    problems = []
    for name, pattern in VERSION_COPIES.items():
        found = pattern.findall((REPO_DIR / name).read_text())
        if found != [version]:
            problems.append(f"{name}: app version {', '.join(found) or 'not found'} != pyproject.toml {version} "
                            f"(a version bump edits pyproject.toml and every copy: {', '.join(VERSION_COPIES)})")
    return problems


def check(lock: dict) -> list[str]:
    """Everything wrong with the lock, each naming its key; [] when consistent."""
    problems: list[str] = []
    L = LOCK_PATH.name
    if lock.get("schema") != 1:
        return [f"{L}: schema must be 1 (got {lock.get('schema')!r})"]
    for section in ("app", "sglang", "python", "base", "arch", "models"):
        if section not in lock:
            problems.append(f"{L}: missing [{section}]")
    if problems:
        return problems

    pyproject = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())
    app_version = pyproject["project"]["version"]
    if app_version != lock["app"]["version"]:
        problems.append(f"{L}: app.version {lock['app']['version']} != pyproject.toml version {app_version}")
    problems += _version_copies(app_version)

    req_path = REPO_DIR / lock["python"]["requirements"]
    actual = sha256_file(req_path)
    if actual != lock["python"]["requirements_sha256"]:
        problems.append(f"{L}: python.requirements_sha256 != sha256({req_path.relative_to(REPO_DIR)}) = {actual}")
    reqs = parse_requirements(req_path)
    pinned_sglang = reqs.get("sglang", ("nothing",))[0]
    if pinned_sglang != lock["sglang"]["version"]:
        problems.append(f"{L}: sglang.version {lock['sglang']['version']} != {lock['python']['requirements']} "
                        f"sglang=={pinned_sglang}")
    for name in lock["python"].get("runtime_exclude", []):
        if _normalize(name) not in reqs:
            problems.append(f"{L}: python.runtime_exclude names '{name}', which {req_path.name} does not pin")

    machines = [pins.get("machine") for pins in lock["arch"].values()]
    for arch, pins in lock["arch"].items():
        where = f"{L}: arch.{arch}"
        if not isinstance(pins.get("machine"), str) or machines.count(pins["machine"]) != 1:
            problems.append(f"{where}.machine must name this arch's machine (uname -m), one per arch "
                            f"(got {pins.get('machine')!r})")
        unknown = set(pins.get("images", ())) - set(IMAGES)
        if unknown or "base" not in images(lock, arch):
            problems.append(f"{where}.images must include base and name only {', '.join(IMAGES)} "
                            f"(got {pins.get('images')})")
        if not appliance(lock, arch):  # a gateway-only arch: a Debian base and the gateway's wheels
            for key in ("debian_suite", "debian_version", "python", "packages", "wheel_platforms"):
                if key not in pins:
                    problems.append(f"{where}.{key} missing")
            continue
        for key in ("debian_suite", "debian_version", "python", "isa", "packages", "torch", "inductor_cache_key"):
            if key not in pins:
                problems.append(f"{where}.{key} missing")
        if "kernels" in pins:
            _check_kernels(where, pins["kernels"], problems)
        if any(key not in pins for key in ("torch", "inductor_cache_key")):
            continue
        torch = pins["torch"]
        if torch.get("source") == "wheel":
            pinned = reqs.get("torch")
            if pinned is None or pinned[0] != torch.get("version") or torch.get("sha256") not in pinned[1]:
                problems.append(f"{where}.torch (version {torch.get('version')}, sha256 {torch.get('sha256')}) != "
                                f"{lock['python']['requirements']} torch {pinned[0] if pinned else 'not pinned'} "
                                f"{pinned[1] if pinned else ''}")
        elif torch.get("source") == "debian":
            patched = torch.get("patched_wheels")
            if not isinstance(patched, dict):
                problems.append(f"{where}.torch.patched_wheels must be a table (may be empty)")
            elif patched:
                _check_shas(f"{where}.torch.patched_wheels", patched, problems)
        else:
            problems.append(f"{where}.torch.source must be 'wheel' or 'debian' (got {torch.get('source')!r})")
        _check_wheelhouse(where, pins.get("wheelhouse"), reqs, lock["python"]["requirements"], problems)
        expected = cache_key(lock, arch)
        if pins["inductor_cache_key"] != expected:
            problems.append(f"{where}.inductor_cache_key is stale: the pins give \"{expected}\" "
                            f"(was \"{pins['inductor_cache_key']}\")")

    models = lock["models"]
    default = models.get("default")
    if default not in models:
        problems.append(f"{L}: models.default {default!r} has no [models.{default}]")
    for name, model in models.items():
        if name == "default":
            continue
        where = f"{L}: models.{name}"
        kind = model.get("kind")
        if kind == "tiny":
            for key in ("arch", "seed"):
                if key not in model:
                    problems.append(f"{where}.{key} missing")
        elif kind == "hf":
            if not re.fullmatch(r"[0-9a-f]{40}", str(model.get("revision", ""))):
                problems.append(f"{where}.revision must be a 40-hex commit (got {model.get('revision')!r})")
            if "repo" not in model:
                problems.append(f"{where}.repo missing")
        elif kind == "gguf":
            _check_gguf_model(where, model, reqs, lock["python"]["requirements"], problems)
        else:
            problems.append(f"{where}.kind must be 'tiny', 'hf' or 'gguf' (got {kind!r})")
        _check_shas(f"{where}.sha256", model.get("sha256", {}), problems)
    return problems


# What a kind "gguf" model names: the wheel it comes from and the GGUF inside it, and the
# packages whose versions decide the converted bytes (images/scripts/convert-gguf.py).
GGUF_ORIGIN_KEYS = ("package", "version", "wheel", "sha256", "file", "licence")
GGUF_CONVERSION_TOOLS = ("transformers", "gguf", "torch")


def _check_gguf_model(where: str, model: dict, reqs: dict, req_name: str, problems: list[str]) -> None:
    origin, conversion = model.get("origin", {}), model.get("conversion", {})
    problems += [f"{where}.origin.{key} missing" for key in GGUF_ORIGIN_KEYS if key not in origin]
    if "sha256" in origin and not SHA256_RE.match(str(origin["sha256"])):
        problems.append(f"{where}.origin.sha256: not a sha256 ({origin['sha256']!r})")
    for tool in GGUF_CONVERSION_TOOLS:
        pinned = reqs.get(tool, ("not pinned",))[0]
        if conversion.get(tool) != pinned:
            problems.append(f"{where}.conversion.{tool} {conversion.get(tool)!r} != {req_name} {tool}=={pinned} "
                            f"(the runtime image converts with it: convert again and pin the new digests)")


def _check_wheelhouse(where: str, wheelhouse: dict | None, reqs: dict, req_name: str, problems: list[str]) -> None:
    if wheelhouse is None:
        return
    for name in wheelhouse.get("pure", []):
        if _normalize(name) not in reqs:
            problems.append(f"{where}.wheelhouse.pure names '{name}', which {req_name} does not pin")
    for name, pin in wheelhouse.get("repacked", {}).items():
        where_pin = f"{where}.wheelhouse.repacked.{name}"
        pinned = reqs.get(_normalize(name))
        if pinned is None:
            problems.append(f"{where_pin}: {req_name} does not pin '{name}'")
        elif not str(pin.get("source", "")).startswith(f"{name}-{pinned[0]}-"):
            problems.append(f"{where_pin}.source {pin.get('source')!r} is not {req_name}'s {name}=={pinned[0]} wheel")
        if not SHA256_RE.match(str(pin.get("sha256", ""))):
            problems.append(f"{where_pin}.sha256: not a sha256 ({pin.get('sha256')!r})")


def refresh(path: Path) -> list[str]:
    """Rewrite, in place, the pins that follow from the repo; returns one line per change.

    app.version (pyproject.toml), sglang.version and python.requirements_sha256
    (requirements/lock.txt), then every arch's inductor_cache_key and kernels.source_sha256
    (app/sglang_rvv/kernels/csrc). Other pins (Debian
    suites, torch wheels, model digests) are decisions or downloads: check names them.
    """
    text = path.read_text()
    changes: list[str] = []

    def set_value(section: str, key: str, value: str) -> None:
        nonlocal text
        line = re.compile(rf'^\[{re.escape(section)}\]\n(?:(?!\[).*\n)*?{re.escape(key)} = "([^"]*)"', re.M)
        match = line.search(text)
        if match is None:
            raise LockError([f"{path.name}: no {section}.{key} = \"...\" line to refresh"])
        if match.group(1) != value:
            changes.append(f"{section}.{key}: {match.group(1)} -> {value}")
            text = text[:match.start(1)] + value + text[match.end(1):]

    lock = tomllib.loads(text)
    set_value("app", "version", tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"]["version"])
    req_path = REPO_DIR / lock["python"]["requirements"]
    set_value("sglang", "version", parse_requirements(req_path).get("sglang", ("unpinned",))[0])
    set_value("python", "requirements_sha256", sha256_file(req_path))
    lock = tomllib.loads(text)
    for arch in filter(lambda arch: appliance(lock, arch), lock["arch"]):
        set_value(f"arch.{arch}", "inductor_cache_key", cache_key(lock, arch))
        if "kernels" in lock["arch"][arch]:
            set_value(f"arch.{arch}.kernels", "source_sha256", kernels_source_sha256())
    if changes:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return changes


def verify_model(lock: dict, name: str, directory: Path) -> list[str]:
    """Files of ``directory`` against models.NAME.sha256: missing, changed, unexpected."""
    expected = get(lock, f"models.{name}.sha256")
    where = f"models.{name}"
    if not directory.is_dir():
        return [f"{where}: model directory {directory} does not exist"]
    actual = {str(p.relative_to(directory)): p for p in sorted(directory.rglob("*")) if p.is_file()}
    problems = [f"{where}: {file} missing from {directory}" for file in sorted(set(expected) - set(actual))]
    problems += [f"{where}: {directory}/{file} is not pinned in {LOCK_PATH.name}"
                 for file in sorted(set(actual) - set(expected))]
    for file in sorted(set(expected) & set(actual)):
        digest = sha256_file(actual[file])
        if digest != expected[file]:
            problems.append(f"{where}: {directory}/{file} sha256 {digest} != lock {expected[file]}")
    return problems


def model_kind(lock: dict, name: str) -> str:
    """models.NAME.kind, or the one line that says NAME is not a model of the lock."""
    models = {key: value for key, value in lock["models"].items() if key != "default"}
    if name not in models:
        raise LockError([f"MODEL={name}: not a model of {LOCK_PATH.name} (known: {', '.join(sorted(models))}; "
                         f"or MODEL_DIR=DIR for a checkpoint directory)"])
    return models[name]["kind"]


def export(lock: dict, arch: str) -> dict:
    pins = arch_pins(lock, arch)
    return {
        "arch": arch, "app": lock["app"], "sglang": lock["sglang"],
        "python": {k: v for k, v in lock["python"].items() if k != "runtime_exclude"},
        **{k: v for k, v in pins.items() if k not in ("packages", "apt_check_valid_until")},
        "base_inputs": _digest(base_inputs(lock, arch)),
        "serving": "sglang" if serves(lock, arch) else "unavailable",
    }


def serves(lock: dict, arch: str) -> bool:
    """Whether the arch's runtime image has SGLang.

    Torch source ``wheel``: the whole of requirements/lock.txt, SGLang included.
    ``debian``: the suite's packages, plus the ``wheelhouse`` wheels when the arch
    pins one with SGLang in it; without it, the app only.
    """
    if not appliance(lock, arch):
        return False
    pins = arch_pins(lock, arch)
    wheelhouse = pins.get("wheelhouse", {})
    return pins["torch"]["source"] == "wheel" or "sglang" in (*wheelhouse.get("pure", ()),
                                                              *wheelhouse.get("repacked", {}))


def labels(lock: dict, arch: str, image: str) -> dict[str, str]:
    pins = arch_pins(lock, arch)
    values = {
        "org.opencontainers.image.title": f"{lock['app']['name']}-{image}",
        "org.opencontainers.image.version": lock["app"]["version"],
        f"{LABEL_PREFIX}.image": image,
        f"{LABEL_PREFIX}.arch": arch,
        f"{LABEL_PREFIX}.debian-suite": pins["debian_suite"],
        f"{LABEL_PREFIX}.base-inputs": _digest(base_inputs(lock, arch)),
    }
    if image != "base":
        serving = serves(lock, arch)
        values.update({
            f"{LABEL_PREFIX}.python": pins["python"],
            f"{LABEL_PREFIX}.torch": f"{pins['torch']['source']}:{pins['torch']['version']}",
            f"{LABEL_PREFIX}.torch-source": pins["torch"]["source"],
            # "unavailable": no SGLang in the image (only the app and its smoke test run)
            f"{LABEL_PREFIX}.serving": "sglang" if serving else "unavailable",
            f"{LABEL_PREFIX}.sglang": lock["sglang"]["version"] if serving else "none",
            f"{LABEL_PREFIX}.app-version": lock["app"]["version"],
            f"{LABEL_PREFIX}.inductor-cache-key": pins["inductor_cache_key"],
        })
        if serving:
            values[f"{LABEL_PREFIX}.requirements-sha256"] = lock["python"]["requirements_sha256"]
        kernels = pins.get("kernels")
        if kernels:  # the RVV extension built into this runtime: how, and from what
            values.update({
                f"{LABEL_PREFIX}.kernels-compiler": f"{kernels['compiler']} {kernels['compiler_version']}",
                f"{LABEL_PREFIX}.kernels-flags": " ".join(kernels["flags"]) if isinstance(kernels["flags"], list)
                else kernels["flags"],
                f"{LABEL_PREFIX}.kernels-source-sha256": kernels["source_sha256"],
            })
    return values


def _requirement_lines(lock: dict, exclude: set[str] | None = None, only: set[str] | None = None) -> list[str]:
    """requirements/lock.txt's entries (each with its hashes), filtered by normalized name."""
    lines, keeping = [], True
    for line in (REPO_DIR / lock["python"]["requirements"]).read_text().splitlines():
        match = REQUIREMENT_RE.match(line.strip())
        if match:
            name = _normalize(match.group(1))
            keeping = (only is None or name in only) and name not in (exclude or set())
        elif not line.startswith((" ", "\t")):
            keeping = only is None
        if keeping:
            lines.append(line)
    return lines


def tool_requirements(lock: dict, tool: str, out: Path) -> None:
    """A host tool's packages (``tools.TOOL.packages``) as requirements/lock.txt pins them."""
    try:
        wanted = {_normalize(n) for n in lock["tools"][tool]["packages"]}
    except KeyError:
        raise LockError([f"tools.{tool}.packages: not in the lock"]) from None
    missing = wanted - parse_requirements(REPO_DIR / lock["python"]["requirements"]).keys()
    if missing:
        raise LockError([f"tools.{tool}.packages: {', '.join(sorted(missing))} not in "
                         f"{lock['python']['requirements']}"])
    out.write_text("\n".join(_requirement_lines(lock, only=wanted)) + "\n")


def _wheelhouse(lock: dict, arch: str) -> dict:
    return arch_pins(lock, arch).get("wheelhouse", {})


def runtime_requirements(lock: dict, out: Path, arch: str | None = None) -> None:
    """What the runtime image installs: requirements/lock.txt without the excluded packages
    (torch source ``wheel``), or the arch's wheelhouse: its pure wheels as lock.txt pins them
    and its repacked wheels at their repacked sha256 (``debian``)."""
    if arch is None or arch_pins(lock, arch)["torch"]["source"] == "wheel":
        exclude = {_normalize(n) for n in lock["python"].get("runtime_exclude", [])}
        lines = _requirement_lines(lock, exclude=exclude)
    else:
        wheelhouse = _wheelhouse(lock, arch)
        lines = _requirement_lines(lock, only={_normalize(n) for n in wheelhouse.get("pure", [])})
        reqs = parse_requirements(REPO_DIR / lock["python"]["requirements"])
        for name, pin in wheelhouse.get("repacked", {}).items():
            lines.append(f"{name}=={reqs[_normalize(name)][0]} \\\n    --hash=sha256:{pin['sha256']}")
    out.write_text("\n".join(lines) + "\n")


def download_requirements(lock: dict, arch: str, out: Path) -> None:
    """What the arch's wheelhouse downloads: its runtime requirements, with each repacked
    wheel replaced by its source wheel as requirements/lock.txt pins it."""
    if arch_pins(lock, arch)["torch"]["source"] == "wheel":
        runtime_requirements(lock, out, arch)
        return
    wheelhouse = _wheelhouse(lock, arch)
    names = {_normalize(n) for n in (*wheelhouse.get("pure", []), *wheelhouse.get("repacked", {}))}
    out.write_text("\n".join(_requirement_lines(lock, only=names)) + "\n")


def _print(value) -> None:
    if isinstance(value, list):
        print("\n".join(str(v) for v in value))
    elif isinstance(value, dict):
        print(json.dumps(value, indent=1, sort_keys=True))
    elif isinstance(value, bool):
        print(str(value).lower())
    else:
        print(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lock.py", description=__doc__.splitlines()[0])
    parser.add_argument("--lock", type=Path, default=LOCK_PATH)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check")
    sub.add_parser("refresh")
    sub.add_parser("arches")
    sub.add_parser("arch-of").add_argument("machine")
    sub.add_parser("label-prefix")
    p = sub.add_parser("require-image")
    p.add_argument("arch")
    p.add_argument("image")
    p = sub.add_parser("get")
    p.add_argument("keys", nargs="+")
    for name in ("cache-key", "base-inputs", "export"):
        sub.add_parser(name).add_argument("arch")
    p = sub.add_parser("labels")
    p.add_argument("arch")
    p.add_argument("image")
    p = sub.add_parser("runtime-requirements")
    p.add_argument("out", type=Path)
    p.add_argument("arch", nargs="?")
    p = sub.add_parser("tool-requirements")
    p.add_argument("tool")
    p.add_argument("out", type=Path)
    p = sub.add_parser("download-requirements")
    p.add_argument("arch")
    p.add_argument("out", type=Path)
    sub.add_parser("repacked").add_argument("arch")
    sub.add_parser("kernels-source-sha256")
    sub.add_parser("model-kind").add_argument("name")
    p = sub.add_parser("verify-model")
    p.add_argument("name")
    p.add_argument("directory", type=Path)
    args = parser.parse_args(argv)

    try:
        lock = load(args.lock)
        if args.command == "check":
            problems = check(lock)
            if problems:
                raise LockError(problems)
            print(f"{args.lock.name}: ok ({', '.join(sorted(lock['arch']))})")
        elif args.command == "refresh":
            changes = refresh(args.lock)
            for change in changes:
                print(f"{args.lock.name}: {change}")
            problems = check(load(args.lock))
            if problems:
                raise LockError(problems)
            print(f"{args.lock.name}: ok ({len(changes)} pins refreshed)")
        elif args.command == "arches":
            _print(sorted(lock["arch"]))
        elif args.command == "arch-of":
            print(arch_of(lock, args.machine))
        elif args.command == "label-prefix":
            print(LABEL_PREFIX)
        elif args.command == "require-image":
            require_image(lock, args.arch, args.image)
        elif args.command == "get":
            for key in args.keys:
                _print(get(lock, key))
        elif args.command == "cache-key":
            print(cache_key(lock, args.arch))
        elif args.command == "base-inputs":
            print(_digest(base_inputs(lock, args.arch)))
        elif args.command == "export":
            print(json.dumps(export(lock, args.arch), indent=1, sort_keys=True))
        elif args.command == "labels":
            for key, value in labels(lock, args.arch, args.image).items():
                print(f"--label={key}={value}")
        elif args.command == "runtime-requirements":
            runtime_requirements(lock, args.out, args.arch)
        elif args.command == "tool-requirements":
            tool_requirements(lock, args.tool, args.out)
        elif args.command == "download-requirements":
            download_requirements(lock, args.arch, args.out)
        elif args.command == "repacked":
            for name, pin in _wheelhouse(lock, args.arch).get("repacked", {}).items():
                print(name, pin["source"], pin["sha256"])
        elif args.command == "kernels-source-sha256":
            print(kernels_source_sha256())
        elif args.command == "model-kind":
            print(model_kind(lock, args.name))
        elif args.command == "verify-model":
            problems = verify_model(lock, args.name, args.directory)
            if problems:
                raise LockError(problems)
            print(f"models.{args.name}: {args.directory} matches the lock")
    except LockError as exc:
        for problem in exc.problems:
            print(f"lock.py: {problem}", file=sys.stderr)
        return 1
    except (OSError, tomllib.TOMLDecodeError) as exc:
        print(f"lock.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
