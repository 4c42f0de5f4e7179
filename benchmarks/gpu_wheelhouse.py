"""The wheelhouse that the GPU check installs from, on a machine that reaches no package registry.

The lent GPU machine's python holds a CUDA torch and many packages, but no Dask. This builds,
here (with PyPI), a folder of wheels with what it lacks to install the project and run its
``gpu`` tests and ``benchmarks/bench_gpu.py``: scaledl_lab's dependency closure plus pytest and
pytest-timeout, resolved for the target python and x86-64 Linux (wheels only), minus torch and its
CUDA packages and minus the packages the machine's image already holds
(``benchmarks/gpu_image_packages.txt``). One version of each package; wheels of an earlier build
that the closure no longer names are removed. The project itself travels as the working tree.

    python benchmarks/gpu_wheelhouse.py                     # .wheelhouse/, for python 3.12
    python benchmarks/gpu_wheelhouse.py --data              # and data/fashion-mnist/ for the tests
    python benchmarks/gpu_wheelhouse.py --python-version 3.11 --out /tmp/wh    # for this machine

Then, on the GPU machine, with ``.wheelhouse`` and ``data/fashion-mnist`` carried beside the
working tree: ``bash benchmarks/gpu_check.sh`` (README, "Existing clusters and GPU workers").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE_LIST = Path(__file__).resolve().parent / "gpu_image_packages.txt"
# Wheels for x86-64 Linux: torch 2.11's own wheels need glibc 2.28, so every tag up to that fits.
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64",
             "manylinux1_x86_64", "linux_x86_64"]  # fmt: skip
# What the GPU check runs besides the project: its tests' runner and the ini's `timeout` option.
TEST_REQUIREMENTS = ["pytest>=7", "pytest-timeout>=2"]
CARRY_LIMIT_MIB = 64  # the working tree and the carried paths together
NEVER = {"torch", "triton", "pytorch-triton"}  # the machine's CUDA torch, never replaced


def canonical(name: str) -> str:
    """PEP 503's normalised name: ``PyYAML`` and ``pyyaml``, ``typing_extensions`` and
    ``typing-extensions`` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_package_list(text: str) -> set[str]:
    """The names of a package list: one a line, ``#`` starts a comment, versions are ignored."""
    names = set()
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(canonical(re.split(r"[\s;<>=!~\[]", line, maxsplit=1)[0]))
    return names


def is_torch_stack(name: str) -> bool:
    """torch and the CUDA libraries its wheels pull in (nvidia-cublas-cu12, ..., triton)."""
    name = canonical(name)
    return name in NEVER or name.startswith("nvidia-")


def select(
    resolved: list[tuple[str, str]], present: set[str], include_present: bool = False
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Split a resolved closure, (name, version) pairs, into what the wheelhouse holds and what
    it leaves to the machine: torch's stack always, the image's packages unless
    ``include_present``. A name resolved twice with two versions is an error."""
    seen: dict[str, str] = {}
    keep, leave = [], []
    for name, version in resolved:
        key = canonical(name)
        if key in seen:
            if seen[key] != version:
                raise ValueError(f"{key} resolved twice: {seen[key]} and {version}")
            continue
        seen[key] = version
        if is_torch_stack(key) or (not include_present and key in present):
            leave.append((key, version))
        else:
            keep.append((key, version))
    return keep, leave


def wheel_name_version(filename: str) -> tuple[str, str]:
    """(canonical name, version) of a wheel's file name (PEP 427: name-version[-build]-py-abi-
    platform.whl; the name's dashes are underscores there)."""
    if not filename.endswith(".whl"):
        raise ValueError(f"not a wheel: {filename}")
    parts = filename[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        raise ValueError(f"not a wheel file name: {filename}")
    return canonical(parts[0]), parts[1]


def one_version_each(filenames: list[str]) -> dict[str, str]:
    """{canonical name: file name} of a wheelhouse; two files of one package (two versions, or
    one version for two platforms) are an error that names them, as pip would pick one of them
    by rules that this build does not control."""
    found: dict[str, str] = {}
    clashes = []
    for filename in sorted(filenames):
        name, _ = wheel_name_version(filename)
        if name in found:
            clashes.append(f"{found[name]} and {filename}")
        else:
            found[name] = filename
    if clashes:
        raise ValueError("more than one wheel of a package: " + "; ".join(clashes))
    return found


def stale(filenames: list[str], keep: list[tuple[str, str]]) -> list[str]:
    """The wheels of a folder that ``keep`` does not name with their version: an earlier build's."""
    wanted = {(canonical(n), v) for n, v in keep}
    return sorted(f for f in filenames if wheel_name_version(f) not in wanted)


def project_requirements() -> list[str]:
    """pyproject.toml's dependencies without torch, plus TEST_REQUIREMENTS."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in deps if not is_torch_stack(read_package_list(d).pop())] + TEST_REQUIREMENTS


def target_flags(python_version: str) -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", python_version]
    for platform in PLATFORMS:
        flags += ["--platform", platform]
    return flags


def resolver_python(python_version: str, given: str | None) -> str:
    """A python of the target's version resolves, when one is found (on PATH, or one of pyenv's):
    pip evaluates markers such as ``python_version < "3.12"`` against the python it runs in, not
    against --python-version."""
    if given:
        return given
    if f"{sys.version_info.major}.{sys.version_info.minor}" == python_version:
        return sys.executable
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"), "versions")
    candidates = [
        shutil.which(f"python{python_version}"),
        *sorted(map(str, pyenv.glob(f"{python_version}.*/bin/python{python_version}"))),
    ]
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys, pip; print(*sys.version_info[:2])"],
                               capture_output=True, text=True)  # fmt: skip
        if probe.returncode == 0 and probe.stdout.split() == python_version.split("."):
            return candidate
    print(f"gpu_wheelhouse: no python{python_version} with pip found; resolving with "
          f"{sys.version.split()[0]}, whose markers may differ (--resolver-python PATH)",
          file=sys.stderr)  # fmt: skip
    return sys.executable


def resolve(requirements: list[str], python_version: str, python: str) -> list[tuple[str, str]]:
    """The closure of ``requirements`` for the target, by pip's resolver (a dry run: only the
    wheels' metadata is fetched), as (name, version) pairs."""
    with tempfile.TemporaryDirectory() as tmp:
        reqs, report = Path(tmp, "requirements.txt"), Path(tmp, "report.json")
        reqs.write_text("\n".join(requirements) + "\n")
        cmd = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report), "--target", str(Path(tmp, "target")),
               *target_flags(python_version), "-r", str(reqs)]  # fmt: skip
        subprocess.run(cmd, check=True)
        items = json.loads(report.read_text())["install"]
    return [(item["metadata"]["name"], item["metadata"]["version"]) for item in items]


def download(keep: list[tuple[str, str]], out: Path, python_version: str, python: str) -> None:
    """pip download, each pinned, without dependencies (the closure is already resolved)."""
    pins = [f"{name}=={version}" for name, version in keep]
    cmd = [python, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(out),
           *target_flags(python_version), *pins]  # fmt: skip
    subprocess.run(cmd, check=True)


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def tree_bytes() -> int:
    """The working tree as the device machine receives it: tracked and untracked-not-ignored."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout  # fmt: skip
    files = (ROOT / f for f in out.decode().split("\0") if f)
    return sum(f.stat().st_size for f in files if f.is_file())


def copy_fashion_mnist() -> Path:
    """Fashion-MNIST's four files into data/fashion-mnist/ (git-ignored), where the tests find it
    on a machine that has no copy of its own."""
    from scaledl_lab.data import locate

    source, dest = Path(locate("fashion-mnist")), ROOT / "data" / "fashion-mnist"
    if source.resolve() != dest.resolve():
        dest.mkdir(parents=True, exist_ok=True)
        for f in sorted(source.glob("*-ubyte.gz")):
            shutil.copy2(f, dest / f.name)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12", help="the target's (default 3.12)")
    parser.add_argument("--out", type=Path, default=ROOT / ".wheelhouse",
                        help="the wheelhouse folder (default .wheelhouse/)")  # fmt: skip
    parser.add_argument(
        "--include-present",
        action="store_true",
        help="keep the image's packages too: everything but torch's stack",
    )
    parser.add_argument(
        "--present-requirements",
        type=Path,
        metavar="FILE",
        help="write name==version of the closure's packages left to the image",
    )
    parser.add_argument(
        "--resolver-python",
        metavar="PATH",
        help="the python whose pip resolves (default: python<version> on PATH)",
    )
    parser.add_argument(
        "--data",
        action="store_true",
        help="also copy Fashion-MNIST into data/fashion-mnist/ to carry",
    )
    args = parser.parse_args(argv)

    python = resolver_python(args.python_version, args.resolver_python)
    present = read_package_list(IMAGE_LIST.read_text())
    resolved = resolve(project_requirements(), args.python_version, python)
    keep, leave = select(resolved, present, args.include_present)
    print(f"closure for python {args.python_version}: {len(resolved)} packages; the wheelhouse "
          f"holds {len(keep)}, the machine's image {len(leave)}")  # fmt: skip
    if args.present_requirements:
        args.present_requirements.write_text(
            "".join(f"{n}=={v}\n" for n, v in leave if not is_torch_stack(n))
        )
    args.out.mkdir(parents=True, exist_ok=True)
    for old in stale([p.name for p in args.out.glob("*.whl")], keep):
        (args.out / old).unlink()
    download(keep, args.out, args.python_version, python)
    wheels = one_version_each([p.name for p in args.out.glob("*.whl")])
    missing = {n for n, _ in keep} - wheels.keys()
    if missing:
        raise SystemExit(f"gpu_wheelhouse: no wheel downloaded for {sorted(missing)}")
    total = 0
    for name in sorted(wheels):
        size = (args.out / wheels[name]).stat().st_size
        total += size
        print(f"  {mib(size):>10}  {wheels[name]}")
    print(f"wheelhouse {args.out}: {len(wheels)} wheels, {mib(total)}")
    data = copy_fashion_mnist() if args.data else ROOT / "data" / "fashion-mnist"
    carried = {"working tree": tree_bytes(), str(args.out): total,
               "data/fashion-mnist": folder_bytes(data)}  # fmt: skip
    whole = sum(carried.values())
    print("carried to the GPU machine: " + ", ".join(f"{k} {mib(v)}" for k, v in carried.items())
          + f"; {mib(whole)} of {CARRY_LIMIT_MIB} MiB")  # fmt: skip
    if whole > CARRY_LIMIT_MIB * 2**20:
        print("gpu_wheelhouse: over the limit", file=sys.stderr)
        return 1
    if not data.exists():
        print("(no data/fashion-mnist/: the tests need it on a machine without its own copy; "
              "--data copies it there)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
