"""Fixtures of the Spark job tests."""

from __future__ import annotations

import pytest

from jobs.spark import s3a_jars


@pytest.fixture
def s3a_available() -> None:
    """Skips a test of Spark on S3 where Spark's S3A jars are not installed (`scripts/setup.sh --s3-spark`)."""
    try:
        s3a_jars()
    except FileNotFoundError as exc:
        pytest.skip(f"Spark's S3A jars are not installed ({exc})")
