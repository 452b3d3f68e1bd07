# SPDX-License-Identifier: Apache-2.0
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from harness import Svc, build_idemsvc, start_idemsvc, start_redis


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("idemsvc-py")


@pytest.fixture(scope="session")
def idemsvc_bin(workdir: Path) -> Path:
    return build_idemsvc(workdir)


_started: dict[str, Svc] = {}


@pytest.fixture(scope="session", params=["memory", "redis"])
def svc(request: pytest.FixtureRequest, idemsvc_bin: Path, workdir: Path) -> Iterator[Svc]:
    """idemsvc on its memory store, and on a Redis of the tests' own."""
    redis_url, redis = (None, None)
    if request.param == "redis":
        redis_url, redis = start_redis(workdir)
    base, key, proc = start_idemsvc(idemsvc_bin, workdir, redis_url)
    s = Svc(base, key, proc, redis)
    yield s
    s.stop()
