"""scripts/gpu_check_items.py: the out-of-memory sizes pass the activation check but cannot fit, and every test that
skips without CUDA is in the GPU check's list."""

import ast
import sys

from tests.conftest import REPO


def test_oom_sizes_pass_the_activation_check_but_cannot_fit():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from gpu_check_items import oom_sizes
    finally:
        sys.path.pop(0)
    for free_gib in (20, 78, 139):
        limit, batch, need = oom_sizes(free_gib * 2**30)
        assert limit == 1024 and batch % 2 == 0
        assert 0.7 * free_gib * 2**30 <= need < 0.8 * free_gib * 2**30  # under the free memory: not refused


def test_every_test_that_skips_without_cuda_is_in_the_gpu_check():
    """A new CUDA-only test (skipif on torch.cuda.is_available(), directly or through a marker) must be added to
    gpu_check_items.CUDA_TESTS, or the GPU check would not run it."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from gpu_check_items import CUDA_TESTS
    finally:
        sys.path.pop(0)
    found = set()
    for path in (REPO / "tests").rglob("test_*.py"):
        tree = ast.parse(path.read_text())
        markers = {t.id for node in tree.body if isinstance(node, ast.Assign) and "cuda.is_available" in
                   ast.unparse(node.value) for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and any(
                    "cuda.is_available" in ast.unparse(d) or ast.unparse(d) in markers for d in node.decorator_list):
                found.add(f"{path.relative_to(REPO)}::{node.name}")
    assert len(found) >= 4 and found <= set(CUDA_TESTS), found - set(CUDA_TESTS)


def test_the_output_folder_is_absolute_whatever_the_current_folder(tmp_path, monkeypatch):
    """The items run commands in other folders (the repository, their own): --out, default `.` or relative, is
    made absolute first (a relative one was resolved again inside each item's folder: 6 of 10 items failed)."""
    monkeypatch.setattr(sys, "path", [str(REPO / "scripts"), *sys.path])  # (gpu_check adds to it: undone after)
    from gpu_check import out_folder

    monkeypatch.chdir(tmp_path)
    here = tmp_path.resolve()
    assert out_folder(".") == here and out_folder("gpu-check/") == here / "gpu-check"
    assert out_folder(str(here / "a" / "b")) == here / "a" / "b" and out_folder("a/../c").is_absolute()
