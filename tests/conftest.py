"""Shared fixtures: a real two-worker Dask LocalCluster (no mocks of Dask or torch)."""

from __future__ import annotations

import pytest
from distributed import Client

from scaledl_lab.cluster import connect


@pytest.fixture(scope="session")
def client() -> Client:
    with connect(2, dashboard=False, log=None) as c:
        yield c
