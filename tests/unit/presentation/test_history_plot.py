"""--plot: NaN, Inf, zero and 'not measured' cells each get their own colour, apart from the finite scale."""

import math

import pytest

from debug_nan.presentation.history_plot import SPECIAL, grids, plot_history
from tests.unit.presentation.test_history_table import deep_history

np = pytest.importorskip("numpy")
pytest.importorskip("matplotlib")


def test_cells_are_sorted_into_their_categories():
    values, cats = grids([[1.0, 100.0, math.nan], [0.0, math.inf, None]])
    assert cats.tolist() == [[0, 0, 1], [3, 2, 4]]
    assert values[0, :2].tolist() == [0.0, 2.0] and np.isnan(values[1]).all()
    assert [SPECIAL[k][1] for k in (1, 2, 3, 4)] == ["NaN", "Inf", "exactly 0", "not measured"]
    assert len({SPECIAL[k][0] for k in SPECIAL}) == 4  # four different colours


def test_a_plot_with_nan_inf_and_zero(tmp_path):
    history, model = deep_history(3, nan_from=20)
    history.steps[0].grad_norms["lm_head.weight"] = 0.0
    history.steps[1].activations["norm"] = math.inf
    path = tmp_path / "h.png"
    plot_history(history, model, str(path), finding_module="layers.20.mlp")
    data = path.read_bytes()
    assert data[:4] == b"\x89PNG" and len(data) > 20000
    assert [p.name for p in tmp_path.iterdir()] == ["h.png"]  # written atomically: no temporary left
    from matplotlib.colors import to_rgb
    from matplotlib.image import imread

    pixels = imread(str(path))[..., :3]
    for colour in ("#d62728", "#ff00ff", "#7f7f7f"):  # NaN, Inf and zero cells (and their legend patches)
        assert (np.abs(pixels - np.array(to_rgb(colour))).max(axis=-1) < 0.02).sum() > 200, colour
