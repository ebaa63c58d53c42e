"""The key that signs repro bundles (presentation/bundle_signature.py), and the keys of others the user trusts.

The key is 32 random bytes kept as 64 hex digits in one file, mode 0600: `$DEBUG_NAN_BUNDLE_KEY` when set, else
`$XDG_CONFIG_HOME/debug-nan/bundle.key`, else `~/.config/debug-nan/bundle.key`. The first bundle written creates it
(atomically: a complete file or none, and two processes creating it at once end with one key). Another person's
key, copied as a file into `trusted-keys/` beside it, makes their bundles replay as the user's own. No torch here.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

KEY_ENV = "DEBUG_NAN_BUNDLE_KEY"


class BundleKeyError(Exception):
    """The key file cannot be read or created; the message names it and why."""


def config_folder() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "debug-nan"


def key_path() -> Path:
    return Path(os.environ[KEY_ENV]).expanduser() if os.environ.get(KEY_ENV) else config_folder() / "bundle.key"


def trusted_folder() -> Path:
    """Where the keys of others the user trusts live: beside the user's own key."""
    return key_path().parent / "trusted-keys"


def key_id(key: bytes) -> str:
    """A key's name in a bundle's header: the first 16 hex digits of its SHA-256 (reveals nothing of the key)."""
    return hashlib.sha256(key).hexdigest()[:16]


def parse_key(text: str) -> bytes | None:
    """A key file's content -> the key (None: not 64 hex digits)."""
    text = text.strip()
    if len(text) != 64:
        return None
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None


def own_key(create: bool) -> bytes | None:
    """The user's key; with `create`, made when there is none yet (None: none and not `create`)."""
    path = key_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        if not create:
            return None
        return _create(path)
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise BundleKeyError(f"the bundle key {path} cannot be read ({why})") from None
    key = parse_key(text)
    if key is None:
        raise BundleKeyError(f"the bundle key {path} is not a key (64 hex digits): move it away and a new one is made")
    return key


def _create(path: Path) -> bytes:
    """A new key written to a private temporary file, then linked to `path` (fails if another process made one
    first: theirs is kept and returned)."""
    key = secrets.token_bytes(32)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.partial")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(key.hex() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return own_key(create=False) or key
    except OSError as exc:
        raise BundleKeyError(f"the bundle key {path} cannot be created ({exc.strerror or exc}); set {KEY_ENV} to a "
                        f"file in a writable folder") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return key


def trusted_keys() -> dict[str, tuple[bytes, Path]]:
    """{key id: (key, its file)} of the files in trusted-keys/ that hold a key (others are ignored)."""
    found = {}
    try:
        files = sorted(p for p in trusted_folder().iterdir() if p.is_file())
    except OSError:
        return found
    for file in files:
        try:
            key = parse_key(file.read_text())
        except (OSError, UnicodeDecodeError):
            continue
        if key is not None:
            found[key_id(key)] = (key, file)
    return found
