"""Shared fixtures: a real two-worker Dask LocalCluster (no mocks of Dask or torch).

Most tests train on small subsets of Fashion-MNIST. Without it, the session stops before
collecting anything, with one message saying where the data was looked for and how to get it.
"""

from __future__ import annotations

import pytest
from distributed import Client

from scaledl_lab.data import DatasetNotFoundError, locate
from scaledl_lab.runtime.dask.cluster import connect


def pytest_sessionstart(session: pytest.Session) -> None:
    try:
        locate("fashion-mnist")
    except DatasetNotFoundError as exc:
        # A usage error stops the session before collection and is printed once.
        raise pytest.UsageError(
            f"the tests train on Fashion-MNIST, which is not installed; get it once and "
            f"rerun.\n{exc}"
        ) from None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run the tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if not config.getoption("--runslow"):
        slow = pytest.mark.skip(reason="slow: run with --runslow")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def client() -> Client:
    with connect(2, dashboard=False, log=None) as c:
        yield c
