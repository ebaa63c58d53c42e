"""Bundles that are trusted or refused before anything is unpickled: a crafted file whose unpickling would write a
file is refused (exit 2, the file never written) whatever version it claims; a bundle written here replays with no
flag, one written under another key with --trust or once that key is trusted; a --task bundle loads with
weights_only=True. (The key's own rules: tests/unit/presentation/test_bundle_signature.py.)"""

from __future__ import annotations

import io
import json
import shutil

import pytest
import torch
from click.testing import CliRunner

from debug_nan import torch_support
from debug_nan.app.cli import main
from debug_nan.presentation import bundle_key, bundle_signature
from debug_nan.presentation.bundle import BUNDLE_VERSION, REQUIRED_KEYS
from tests.e2e.cli.test_replay import run_with_bundle
from tests.support.bundles import payload, save_signed

VERSIONS = [1, BUNDLE_VERSION, BUNDLE_VERSION + 1, 99]


class WritesAFile:
    """Unpickling it opens (creates) `path`: a stand-in for any code a pickle can run."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def crafted(tmp_path, version: int) -> dict:
    return {"version": version, **{k: None for k in REQUIRED_KEYS}, "settings": {},
            "payload": WritesAFile(tmp_path / "written-by-the-bundle")}


def bare(tmp_path, version):
    """torch's own file, no signature: a bundle of an older debug-nan's shape, or any pickle named .pt."""
    torch.save(crafted(tmp_path, version), tmp_path / "b.pt", **torch_support.save_options())


def foreign(tmp_path, version):
    """Signed, by a key that is not this user's."""
    save_signed(tmp_path / "b.pt", crafted(tmp_path, version), code=True, version=version, key=b"k" * 32)


def changed(tmp_path, version):
    """Signed by this user's key, then its content changed (the signature line kept)."""
    save_signed(tmp_path / "b.pt", {"version": version, "settings": {}, "note": "x" * 64}, version=version)
    blob = (tmp_path / "b.pt").read_bytes()
    head = blob[:blob.index(b"hmac-sha256 ")]
    signature = blob[len(head):blob.index(b"\n", len(head)) + 1]
    evil = io.BytesIO()
    torch.save(crafted(tmp_path, version), evil, **torch_support.save_options())
    (tmp_path / "b.pt").write_bytes(head + signature + evil.getvalue())


def replay(*args: str):
    return CliRunner().invoke(main, ["replay", *map(str, args)])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("make", [bare, foreign, changed], ids=lambda f: f.__name__)
def test_a_crafted_bundle_is_refused_before_it_is_unpickled(tmp_path, make, version):
    make(tmp_path, version)
    out = replay(tmp_path / "b.pt", "--report", tmp_path / "r.json")
    assert out.exit_code == 2, out.output
    assert not (tmp_path / "written-by-the-bundle").exists()  # nothing of it ran
    message = json.loads((tmp_path / "r.json").read_text())["error"]
    assert "who wrote it is unknown" in message and "can run any code" in message and "--trust" in message
    assert "trusted-keys" in message and "\n" not in message and "Traceback" not in out.output
    reason = {"bare": "carries no debug-nan signature", "foreign": "signed by a key that is not yours",
              "changed": "does not match its signature"}[make.__name__]
    assert reason in message, message


@pytest.mark.parametrize("version", VERSIONS)
def test_a_signed_bundle_that_says_it_holds_no_code_is_read_weights_only(tmp_path, version):
    """Signed by this user's key (a file made by hand, or by a bug) yet holding an object: its header says no code,
    so it is read with weights_only=True, and what would run never does."""
    save_signed(tmp_path / "b.pt", crafted(tmp_path, version), code=False, version=version)
    out = replay(tmp_path / "b.pt")
    assert out.exit_code == 2, out.output
    assert not (tmp_path / "written-by-the-bundle").exists()
    assert ("newer debug-nan" if version > BUNDLE_VERSION else "holds only tensors and plain values") in out.output


def test_a_bundle_written_here_replays_another_key_is_refused_trusted_or_added(tmp_path, monkeypatch):
    _, first = run_with_bundle(tmp_path)
    bundle = first["bundle"]
    head = open(bundle, "rb").read(200).decode(errors="replace")
    assert head.startswith("debug-nan bundle\n") and '"code": false' in head  # (a --task bundle)
    assert replay(bundle, "--device", "cpu").exit_code == 1  # written on this machine: no flag
    writer = bundle_key.key_path()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "someone-else"))  # another user, with no key yet
    out = replay(bundle, "--device", "cpu")
    assert out.exit_code == 2 and "signed by a key that is not yours" in out.output, out.output
    assert not bundle_key.key_path().exists()  # a replay creates no key
    out = replay(bundle, "--device", "cpu", "--trust", "--report", tmp_path / "r.json")
    assert out.exit_code == 1, out.output
    assert "Same origin as recorded in the bundle." in json.loads((tmp_path / "r.json").read_text())["notes"]
    bundle_key.trusted_folder().mkdir(parents=True)
    shutil.copy(writer, bundle_key.trusted_folder() / "colleague")
    assert replay(bundle, "--device", "cpu").exit_code == 1  # their key added: no flag


def test_a_task_bundle_loads_with_weights_only(tmp_path):
    _, first = run_with_bundle(tmp_path)
    data = torch.load(io.BytesIO(payload(first["bundle"])), weights_only=True)
    assert data["version"] == BUNDLE_VERSION and data["task_source"] and data["batches"]
    assert isinstance(data["rng"][0]["numpy"][1], list)  # NumPy's RNG keys as ints: no array to unpickle


def test_the_signature_covers_every_byte(tmp_path):
    """One byte changed anywhere in a real bundle (header or torch's bytes) and it is refused."""
    _, first = run_with_bundle(tmp_path)
    blob = open(first["bundle"], "rb").read()
    for where in (len(bundle_signature.MAGIC) + 3, len(blob) // 2, len(blob) - 1):
        edited = bytearray(blob)
        edited[where] ^= 0x01
        (tmp_path / "e.pt").write_bytes(bytes(edited))
        out = replay(tmp_path / "e.pt")
        assert out.exit_code == 2 and "--trust" in out.output, (where, out.output)
