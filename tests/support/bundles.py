"""Bundles made by hand, signed with the key of the test session (tests/conftest.py points XDG_CONFIG_HOME at a
temporary folder), and a bundle's content read back: for the tests that edit or craft a bundle's content."""

from __future__ import annotations

import io
from pathlib import Path

import torch

from debug_nan import torch_support
from debug_nan.presentation import bundle_key, bundle_signature
from debug_nan.presentation.bundle import BUNDLE_VERSION, read_bundle


def save_signed(path: Path, data: dict, code: bool = False, version: int = BUNDLE_VERSION,
                key: bytes | None = None) -> Path:
    """torch.save(data) as a bundle signed by `key` (default: this session's own key)."""
    buffer = io.BytesIO()
    torch.save(data, buffer, **torch_support.save_options())
    payload = buffer.getvalue()
    key = key if key is not None else bundle_key.own_key(create=True)
    Path(path).write_bytes(bundle_signature.header(payload, code, version, key) + payload)
    return Path(path)


def load(path: Path) -> dict:
    """A bundle's content, its signature checked (a `run` bundle's objects unpickled)."""
    return read_bundle(path)


def payload(path: Path) -> bytes:
    """What torch.save wrote, without the signature's lines."""
    return bundle_signature.open_bundle(Path(path), trust=True).payload
