"""The GPU check's wheelhouse builder, its pure parts (benchmarks/gpu_wheelhouse.py): what it
leaves to the GPU machine's image, one wheel per package, the image's list as committed.

The whole check (a wheelhouse, a fresh venv, the network off) needs minutes and PyPI:
benchmarks/gpu_check_local.sh runs it, by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from common import BENCHMARKS, benchmark_module


@pytest.fixture(scope="module")
def wh():
    with benchmark_module("gpu_wheelhouse") as module:
        yield module


RESOLVED = [("distributed", "2026.8.0"), ("dask", "2026.8.0"), ("PyYAML", "6.0.4"),
            ("numpy", "2.4.6"), ("tornado", "6.6.1"), ("nvidia-cublas-cu12", "12.9.1.4"),
            ("torch", "2.11.0"), ("triton", "3.5.0"), ("typing_extensions", "4.15.0"),
            ("mnist1d", "0.0.2.post1")]  # fmt: skip


def test_the_image_and_torch_stay_out(wh):
    present = wh.read_package_list("# the image\nnumpy\npyyaml  # comment\ntyping-extensions\n")
    keep, leave = wh.select(RESOLVED, present)
    assert keep == [("distributed", "2026.8.0"), ("dask", "2026.8.0"), ("tornado", "6.6.1"),
                    ("mnist1d", "0.0.2.post1")]  # fmt: skip
    assert {n for n, _ in leave} == {"pyyaml", "numpy", "nvidia-cublas-cu12", "torch", "triton",
                                     "typing-extensions"}  # fmt: skip


def test_include_present_keeps_all_but_torch(wh):
    keep, leave = wh.select(RESOLVED, {"numpy", "pyyaml"}, include_present=True)
    assert {n for n, _ in leave} == {"nvidia-cublas-cu12", "torch", "triton"}
    assert ("numpy", "2.4.6") in keep and ("pyyaml", "6.0.4") in keep


def test_a_package_resolved_with_two_versions_is_an_error(wh):
    with pytest.raises(ValueError, match="dask resolved twice: 2026.8.0 and 2026.7.0"):
        wh.select([("dask", "2026.8.0"), ("Dask", "2026.7.0")], set())
    keep, _ = wh.select([("dask", "2026.8.0"), ("Dask", "2026.8.0")], set())
    assert keep == [("dask", "2026.8.0")]


def test_one_wheel_per_package(wh):
    names = ["dask-2026.8.0-py3-none-any.whl", "PyYAML-6.0.4-cp312-cp312-manylinux2014_x86_64.whl",
             "typing_extensions-4.15.0-py3-none-any.whl"]  # fmt: skip
    assert wh.one_version_each(names) == {
        "dask": names[0], "pyyaml": names[1], "typing-extensions": names[2],
    }  # fmt: skip
    with pytest.raises(ValueError, match="dask-2026.7.0-py3-none-any.whl and dask-2026.8.0"):
        wh.one_version_each([*names, "dask-2026.7.0-py3-none-any.whl"])
    two_platforms = ["pyyaml-6.0.4-cp312-cp312-manylinux_2_28_x86_64.whl", names[1]]
    with pytest.raises(ValueError, match="more than one wheel of a package"):
        wh.one_version_each(two_platforms)
    with pytest.raises(ValueError, match="not a wheel"):
        wh.one_version_each(["dask-2026.8.0.tar.gz"])


def test_an_earlier_builds_wheels_are_stale(wh):
    names = ["dask-2026.7.0-py3-none-any.whl", "zict-3.0.0-py2.py3-none-any.whl",
             "numpy-2.4.6-cp312-cp312-manylinux_2_28_x86_64.whl"]  # fmt: skip
    keep = [("dask", "2026.8.0"), ("zict", "3.0.0")]
    assert wh.stale(names, keep) == [names[0], names[2]]


def test_the_committed_image_list(wh):
    """Names only; it holds torch and the test runner, not what the wheelhouse brings."""
    present = wh.read_package_list(wh.IMAGE_LIST.read_text())
    assert wh.IMAGE_LIST == BENCHMARKS / "gpu_image_packages.txt"
    assert "2026-11-17" in wh.IMAGE_LIST.read_text()
    needed = {"torch", "numpy", "pandas", "pyarrow", "matplotlib", "pytest", "pytest-timeout"}
    assert needed <= present
    assert not present & {"dask", "distributed", "mnist1d"}
    assert all(name == wh.canonical(name) for name in present)


def test_requirements_are_the_projects_without_torch(wh):
    reqs = wh.project_requirements()
    names = {wh.read_package_list(r).pop() for r in reqs}
    assert {"dask", "distributed", "mnist1d", "pytest", "pytest-timeout"} <= names
    assert "torch" not in names


def test_the_check_scripts_are_where_the_readme_says(wh):
    readme = (Path(wh.ROOT) / "README.md").read_text()
    for script in ("gpu_wheelhouse.py", "gpu_check.sh", "gpu_check_local.sh"):
        assert (BENCHMARKS / script).exists()
        assert f"benchmarks/{script}" in readme
