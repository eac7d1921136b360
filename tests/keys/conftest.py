from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from engine import ManualClock
from engine.keys import Keyring, MasterKey, keyring_folder

ACCOUNT = "ORDERS"


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    return keyring_folder(tmp_path / "warehouse" / ACCOUNT)


@pytest.fixture
def master() -> MasterKey:
    return MasterKey.from_config("k3y-for-tests-0123456789abcdefXYZ", "aes")


@pytest.fixture
def ring(keys_dir: Path, master: MasterKey, clock: ManualClock) -> Keyring:
    return Keyring.open(keys_dir, ACCOUNT, master, clock=clock)


def new_stream_id() -> str:
    return uuid.uuid4().hex


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under a folder: its bytes and modification time."""
    files = [p for p in sorted(folder.rglob("*")) if p.is_file()]
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in files}


def all_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())
