"""A real tritonserver on free loopback ports, shared by the integration tests."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def server(tiny_repository, tmp_path_factory):
    from facefuse.serving.server import LocalTritonServer, ServerConfig

    log = tmp_path_factory.mktemp("server") / "tritonserver.log"
    with LocalTritonServer(ServerConfig(repository=tiny_repository), log_path=log) as running:
        running.log = log
        yield running
