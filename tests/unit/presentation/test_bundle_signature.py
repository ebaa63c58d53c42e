"""The bundle key and signature (presentation/bundle_key.py, bundle_signature.py) and what is written weights-only
(presentation/bundle.py's weights_only_safe), each alone; through `debug-nan replay`:
tests/e2e/cli/test_bundle_trust.py."""

import io
import os
import stat
from collections import OrderedDict

import numpy as np
import pytest
import torch

from debug_nan import torch_support
from debug_nan.errors import InputError
from debug_nan.presentation import bundle_key, bundle_signature
from debug_nan.presentation.bundle import weights_only_safe


@pytest.fixture
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(bundle_key.KEY_ENV, raising=False)
    return tmp_path / "config" / "debug-nan"


def test_the_key_is_made_once_private_and_kept(config):
    assert bundle_key.own_key(create=False) is None and not config.exists()
    key = bundle_key.own_key(create=True)
    path = config / "bundle.key"
    assert len(key) == 32 and path.read_text() == key.hex() + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert bundle_key.own_key(create=True) == key == bundle_key.own_key(create=False)
    assert [p.name for p in config.iterdir()] == ["bundle.key"]  # no temporary file left


def test_a_key_made_meanwhile_by_another_process_is_the_one_kept(config):
    config.mkdir(parents=True)
    theirs = os.urandom(32)
    (config / "bundle.key").write_text(theirs.hex())
    assert bundle_key._create(config / "bundle.key") == theirs  # (the link to the name fails: theirs wins)
    assert [p.name for p in config.iterdir()] == ["bundle.key"]


def test_the_key_path_can_be_set(config, tmp_path, monkeypatch):
    monkeypatch.setenv(bundle_key.KEY_ENV, str(tmp_path / "elsewhere" / "my.key"))
    key = bundle_key.own_key(create=True)
    assert (tmp_path / "elsewhere" / "my.key").read_text().strip() == key.hex() and not config.exists()
    assert bundle_key.trusted_folder() == tmp_path / "elsewhere" / "trusted-keys"


def test_a_damaged_key_is_said_not_replaced(config):
    config.mkdir(parents=True)
    (config / "bundle.key").write_text("not a key")
    with pytest.raises(bundle_key.BundleKeyError, match="is not a key"):
        bundle_key.own_key(create=True)
    assert (config / "bundle.key").read_text() == "not a key"


def signed(path, payload: bytes, key: bytes, code=False):
    path.write_bytes(bundle_signature.header(payload, code, 2, key) + payload)
    return path


def test_own_trusted_foreign_unsigned(config, tmp_path):
    own = bundle_key.own_key(create=True)
    mine = signed(tmp_path / "mine.pt", b"PK-torch-bytes", own)
    opened = bundle_signature.open_bundle(mine, trust=False)
    assert (opened.payload, opened.version, opened.code) == (b"PK-torch-bytes", 2, False)
    assert "your key" in opened.signer
    other = os.urandom(32)
    theirs = signed(tmp_path / "theirs.pt", b"x", other, code=True)
    with pytest.raises(InputError, match=f"key id {bundle_key.key_id(other)}"):
        bundle_signature.open_bundle(theirs, trust=False)
    assert bundle_signature.open_bundle(theirs, trust=True).code is True
    (config / "trusted-keys").mkdir()
    (config / "trusted-keys" / "ada").write_text(other.hex() + "\n")
    assert "ada" in bundle_signature.open_bundle(theirs, trust=False).signer
    (tmp_path / "bare.pt").write_bytes(b"PK\x03\x04 torch's own file")
    with pytest.raises(InputError, match="carries no debug-nan signature"):
        bundle_signature.open_bundle(tmp_path / "bare.pt", trust=False)
    bare = bundle_signature.open_bundle(tmp_path / "bare.pt", trust=True)
    assert bare.code is True and bare.version is None  # trusted blind: read as it is, any object


def test_the_header_is_signed_too(config, tmp_path):
    """Turning "code": true into false (to be read another way) or the version breaks the signature."""
    own = bundle_key.own_key(create=True)
    blob = signed(tmp_path / "b.pt", b"payload", own, code=True).read_bytes()
    for old, new in ((b'"code": true', b'"code": false'), (b'"version": 2', b'"version": 1')):
        (tmp_path / "e.pt").write_bytes(blob.replace(old, new))
        with pytest.raises(InputError, match="does not match its signature"):
            bundle_signature.open_bundle(tmp_path / "e.pt", trust=False)


class Mine:
    pass


def test_weights_only_safe_says_what_torch_load_weights_only_reads():
    state = {"model": OrderedDict(w=torch.zeros(2)), "p": torch.nn.Parameter(torch.ones(1)), "name": "x",
             "groups": [{"lr": 0.1, "betas": (0.9, 0.99), "foreach": None, "fused": False}],
             "rng": [{"numpy": ("MT19937", [1, 2], 0, 0, 0.0)}, {"torch": torch.zeros(8, dtype=torch.uint8)}]}
    assert weights_only_safe(state)
    buffer = io.BytesIO()
    torch.save(state, buffer, **torch_support.save_options())  # (torch 2.5 on Python 3.13: the pure pickler)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["groups"][0]["betas"] == (0.9, 0.99)
    for unsafe in (np.zeros(2), np.float64(1.0), Mine(), lambda: 0, torch.__version__, {Mine(): 1}, {1, 2}):
        assert not weights_only_safe({"batches": [unsafe]}), unsafe
