"""The real AAM code for the scripts that drive it (aam_pretrain.py, aam_fsdp.py): a checkout of github.com/jbk708/aam
at $DEBUG_NAN_AAM_DIR (not committed here: third-party code fetched for testing stays out of this repository) put on
sys.path, and a stand-in for scikit-learn, which AAM imports for its validation metrics only (not installed here):
a module whose functions raise if called.

    import aam_checkout  # (a sibling of the script: its folder is sys.path[0])
    aam_checkout.use()
"""

import importlib.util
import os
import sys
import types
from importlib.machinery import ModuleSpec

METRICS = ("mean_absolute_error", "mean_squared_error", "r2_score", "accuracy_score", "confusion_matrix",
           "precision_recall_fscore_support")


def use() -> str:
    """AAM importable (its checkout first on sys.path) -> the checkout's folder."""
    where = os.environ["DEBUG_NAN_AAM_DIR"]
    sys.path.insert(0, where)
    if importlib.util.find_spec("sklearn") is None:
        _stand_in_for_sklearn()
    return where


def _stand_in_for_sklearn() -> None:
    def missing(*args, **kwargs):
        raise RuntimeError("scikit-learn is not installed (stand-in for AAM's validation metrics)")

    metrics = types.ModuleType("sklearn.metrics")
    metrics.__spec__ = ModuleSpec("sklearn.metrics", None)
    for name in METRICS:
        setattr(metrics, name, missing)
    package = types.ModuleType("sklearn")
    package.__spec__ = ModuleSpec("sklearn", None, is_package=True)
    sys.modules["sklearn"], sys.modules["sklearn.metrics"] = package, metrics
