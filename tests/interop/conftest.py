"""Shared fixtures of the interop suites. `cargo xtask test` sets MINKTEST_BIN_DIR and
the MINKTEST_S3_* variables before running pytest."""

import os
import pathlib
import uuid

import pytest


@pytest.fixture(scope="session")
def bin_dir() -> pathlib.Path:
    path = os.environ.get("MINKTEST_BIN_DIR")
    if not path:
        pytest.fail("MINKTEST_BIN_DIR is not set; run the interop suites with `cargo xtask test`")
    return pathlib.Path(path)


@pytest.fixture(scope="session")
def mink_node(bin_dir) -> pathlib.Path:
    binary = bin_dir / "mink-node"
    assert binary.is_file(), f"{binary} is missing; build the workspace first"
    return binary


@pytest.fixture(scope="session")
def mink_query(bin_dir) -> pathlib.Path:
    binary = bin_dir / "mink-query"
    assert binary.is_file(), f"{binary} is missing; build the workspace first"
    return binary


@pytest.fixture()
def s3_url() -> dict:
    """Environment for a node on the local S3 server, under a fresh prefix."""
    endpoint = os.environ.get("MINKTEST_S3_ENDPOINT")
    bucket = os.environ.get("MINKTEST_S3_BUCKET")
    if not endpoint or not bucket:
        pytest.fail("MINKTEST_S3_ENDPOINT is not set; run with `cargo xtask test`")
    return {
        "MINK_OBJECT_STORE__URL": f"s3://{bucket}/interop-{uuid.uuid4().hex}",
        "MINK_OBJECT_STORE__ENDPOINT": endpoint,
        "MINK_OBJECT_STORE__ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }


def clean_env(extra: dict | None = None) -> dict:
    """The process environment without MINK_* variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINK_")}
    env.update(extra or {})
    return env
