"""A repro bundle's signature: written with the bundle, checked over the file's exact bytes before anything in it is
unpickled (loading a pickle can run code stored in it).

A bundle file is three lines, then what torch.save wrote:

    debug-nan bundle
    {"version": 2, "key": "<the key's id>", "code": false}
    hmac-sha256 <64 hex digits>

The third line is the HMAC-SHA256, under the writer's key (presentation/bundle_key.py), of the first two lines and
every byte after the third: a changed byte or another key fails it. "code": whether the bundle holds objects of the
script (a `debug-nan run` bundle: its model, optimizer and loss code, pickled by value); a bundle without them is
read with torch.load(weights_only=True) even once its signature holds. No torch here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path

from debug_nan.errors import InputError
from debug_nan.presentation import bundle_key

MAGIC = b"debug-nan bundle\n"
SIGNATURE = b"hmac-sha256 "


@dataclass
class Opened:
    """A bundle file whose signature held (or that the user trusts): its torch bytes and what its header says."""
    payload: bytes
    version: object  # the header's version (None: a file with no header, trusted with --trust)
    code: bool  # may hold the script's objects: only then read with weights_only=False
    signer: str  # whose key checked it, in words


def _mac(key: bytes, head: bytes, payload) -> str:
    digest = hmac.new(key, head, hashlib.sha256)
    digest.update(payload)
    return digest.hexdigest()


def header(payload, code: bool, version: int, key: bytes) -> bytes:
    """The three lines written before `payload` (torch.save's bytes) under `key`."""
    meta = json.dumps({"version": version, "key": bundle_key.key_id(key), "code": code}).encode() + b"\n"
    return MAGIC + meta + SIGNATURE + _mac(key, MAGIC + meta, payload).encode() + b"\n"


def _split(blob: bytes) -> tuple[dict, bytes, str, bytes] | None:
    """A file's bytes -> (header fields, the signed head, the signature, the payload); None: no header of ours."""
    if not blob.startswith(MAGIC):
        return None
    meta_end = blob.find(b"\n", len(MAGIC), len(MAGIC) + 4096)
    sig_end = blob.find(b"\n", meta_end + 1, meta_end + 200) if meta_end > 0 else -1
    if sig_end < 0 or not blob[meta_end + 1:sig_end].startswith(SIGNATURE):
        return None
    try:
        meta = json.loads(blob[len(MAGIC):meta_end])
    except ValueError:
        return None
    if not isinstance(meta, dict):
        return None
    signature = blob[meta_end + 1 + len(SIGNATURE):sig_end].decode("ascii", "replace")
    return meta, blob[:meta_end + 1], signature, memoryview(blob)[sig_end + 1:]


def open_bundle(path: Path, trust: bool) -> Opened:
    """Read `path` and check its signature -> Opened. A file unsigned, changed since it was signed, or signed by a
    key the user does not have is refused (InputError, exit 2) unless `trust`; nothing is unpickled here."""
    blob = path.read_bytes()
    parts = _split(blob)
    if parts is None:
        if trust:
            return Opened(blob, None, True, "none: trusted with --trust")
        raise InputError(_refusal(path, "carries no debug-nan signature (it was not written by debug-nan, or by one "
                                        "older than signed bundles)"))
    meta, head, signature, payload = parts
    code = meta.get("code") is not False
    keys = {kid: (key, f"the trusted key {file}") for kid, (key, file) in bundle_key.trusted_keys().items()}
    own = bundle_key.own_key(create=False)
    if own is not None:
        keys[bundle_key.key_id(own)] = (own, f"your key {bundle_key.key_path()}")
    signer = keys.get(meta.get("key"))
    if signer is not None and hmac.compare_digest(_mac(signer[0], head, payload), signature):
        return Opened(bytes(payload), meta.get("version"), code, signer[1])
    if trust:
        return Opened(bytes(payload), meta.get("version"), code, "none: trusted with --trust")
    if signer is not None:
        raise InputError(_refusal(path, f"does not match its signature (by {signer[1]}): it changed after it was "
                                        f"written (edited, or damaged on the way)"))
    raise InputError(_refusal(path, f"is signed by a key that is not yours nor one you trust (key id "
                                    f"{str(meta.get('key'))[:16]})"))


def _refusal(path: Path, why: str) -> str:
    return (f"Bundle {path} {why}, so who wrote it is unknown, and replaying a bundle unpickles it, which can run "
            f"any code stored in it: it was not loaded. If you trust where it came from, replay it with --trust; to "
            f"trust every bundle of whoever wrote it, copy their key file (their {_home_key()}) into "
            f"{bundle_key.trusted_folder()}/.")


def _home_key() -> str:
    return f"${bundle_key.KEY_ENV} or ~/.config/debug-nan/bundle.key"
