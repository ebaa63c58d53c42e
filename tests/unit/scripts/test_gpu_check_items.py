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


def test_aams_fsdp_item_skips_with_its_reason_without_cuda_or_without_aams_fsdp_path(tmp_path, monkeypatch):
    """aam_fsdp_run runs nothing without CUDA (AAM's wrap_model_fsdp refuses the CPU), nor where DEBUG_NAN_AAM_DIR
    is unset or a checkout without aam/training/distributed.py (089f32d, test_run_aam.py's commit)."""
    monkeypatch.setattr(sys, "path", [str(REPO / "scripts"), *sys.path])
    from gpu_check import Item
    from gpu_check_items import aam_fsdp_run

    class Check:
        cuda = False

        def run(self, *args, **kwargs):
            raise AssertionError("a skipped item runs no command")

    old = tmp_path / "aam"
    (old / "aam" / "training").mkdir(parents=True)
    for cuda, aam, reason in [(False, "", "skipped (no CUDA): AAM's wrap_model_fsdp refuses the CPU"),
                              (True, None, "DEBUG_NAN_AAM_DIR (unset) is not a checkout"),
                              (True, str(old), f"DEBUG_NAN_AAM_DIR ({old}) is not a checkout")]:
        if aam is None:
            monkeypatch.delenv("DEBUG_NAN_AAM_DIR", raising=False)
        else:
            monkeypatch.setenv("DEBUG_NAN_AAM_DIR", aam)
        check, item = Check(), Item("aam_fsdp_run", "AAM")
        check.cuda = cuda
        aam_fsdp_run(check, item)
        assert item.status == "skipped" and item.reason.startswith(reason), item.reason
        assert item.figures == {} and item.commands == []
    assert item.reason.endswith("check out 6f65d20")


def test_the_launcher_item_skips_with_its_reason_without_two_gpus(monkeypatch):
    """launchers (NCCL, one GPU per rank) runs nothing on the CPU nor on one GPU, and says why."""
    monkeypatch.setattr(sys, "path", [str(REPO / "scripts"), *sys.path])
    import torch
    from gpu_check import Item
    from gpu_check_launchers import launchers

    class Check:
        cuda = False

        def run(self, *args, **kwargs):
            raise AssertionError("a skipped item runs no command")

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for cuda, reason in [(False, "skipped (no CUDA): NCCL launches need 2 GPUs"),
                         (True, "needs 2 CUDA GPUs (one per rank), 1 here")]:
        check, item = Check(), Item("launchers", "launchers")
        check.cuda = cuda
        launchers(check, item)
        assert (item.status, item.reason.startswith(reason), item.commands) == ("skipped", True, []), item.reason
