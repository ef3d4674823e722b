"""Fixtures of the storage tests: Azurite (a real Blob endpoint on 127.0.0.1) and a fault proxy before it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from storage.azurite import Azurite, azurite, blob_url, shorten_sdk_backoff, use_connection_string
from storage.fault_proxy import FaultProxy

__all__ = ["ProxiedBlob", "azurite", "blob_url", "proxied_blob"]


@dataclass
class ProxiedBlob:
    """A fresh container reached through a fault proxy: `url` is abfs://<container>."""

    url: str
    proxy: FaultProxy
    azurite: Azurite


@pytest.fixture
def proxied_blob(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> Iterator[ProxiedBlob]:
    container = azurite.create_container()
    with FaultProxy(("127.0.0.1", azurite.port)) as proxy:
        use_connection_string(monkeypatch, azurite.connection_string(proxy.port))
        shorten_sdk_backoff(monkeypatch)
        yield ProxiedBlob(f"abfs://{container}", proxy, azurite)
