"""Files as the tests compare them."""

import hashlib
import os
from pathlib import Path


def fingerprint(root: Path) -> dict[str, str]:
    """Path -> content hash (or link target / kind) of everything under root, without following links."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "link -> " + os.readlink(path)
            elif path.is_file():
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                out[rel] = "dir" if path.is_dir() else "special"
    return out
