"""The per-layer history table: one screen at any depth, unique names, sparklines on a stated scale, 100 columns.
(In a real run's log: tests/e2e/cli/test_history_table.py.)"""

import json
import math

from torch import nn

from debug_nan.engine.watch.history import History
from debug_nan.presentation.history_rows import Layout, build_rows, units
from debug_nan.presentation.history_table import history_lines, short_labels, sparkline
from tests.support.tasks import deep_stack


def test_sparkline_log_scale_and_markers():
    assert sparkline([1, 10, 100, 1000]) == "▁▃▆█"
    assert sparkline([1.0, math.nan, None, 2.0]) == "▄! ▆"  # a 2x range takes its share of one decade
    assert sparkline([5.0, 0.0, math.inf]) == "▅_!"


def test_sparkline_of_steady_values_is_flat():
    assert sparkline([3.41, 3.41]) == "▅▅"
    assert sparkline([3.409, 3.412, 3.41]) == "▅▅▅"  # 0.1% apart: not a slope
    assert sparkline([1.0, 10.0]) == "▁█"  # one decade: the full height


def test_sparkline_buckets_long_runs_keeping_the_worst():
    values = [1.0] * 30 + [math.nan] + [1.0] * 9
    line = sparkline(values, 8)
    assert len(line) == 8 and line.count("!") == 1 and line[6] == "!"


def deep_history(steps: int, grow_block: int | None = None, nan_from: int | None = None):
    """A History of DeepLM (32 blocks) with every module's output and every parameter's gradient norm; block
    `grow_block` grows 10x per step; from block `nan_from` on everything is NaN in the last step."""
    model = deep_stack.DeepLM()
    history = History()
    for step in range(1, steps + 1):
        rec = history.begin(step)
        for name, _ in model.named_modules():
            block = int(name.split(".")[1]) if name.startswith("layers.") else None
            value = 2.0 * (10.0 ** step if block == grow_block else 1.0)
            if nan_from is not None and step == steps and block is not None and block >= nan_from:
                value = math.nan
            rec.activations[name] = value
        for name, _ in model.named_parameters():
            rec.grad_norms[name] = 0.5
        rec.grad_norm = 0.5 * math.sqrt(len(rec.grad_norms))
    return history, model


def test_a_32_block_model_fits_one_screen():
    history, model = deep_history(6, grow_block=23)
    assert len(units(model)) == 291
    lines = history_lines(history, model, finding_module="layers.9.mlp.down_proj")
    table = "\n".join(lines)
    assert len(lines) <= 16, table  # header 2, rows, total, legend 2 + grouping note 2
    labels = [line.split()[0] for line in lines[2:]]
    assert "layers.0..31" in labels  # all 32 blocks in one range row
    assert "layers.23" in labels  # the block that grew most
    assert "layers.9" in labels  # the block of the finding
    assert {"embed_tokens", "norm", "lm_head"} <= set(labels)
    assert "291 modules with parameters in" in table and "--history full" in table
    assert all(len(line) <= 100 for line in lines)


def test_full_history_lists_every_module_within_100_columns_and_unique():
    history, model = deep_history(40)
    lines = history_lines(history, model, full=True)
    rows = lines[2:2 + 291]
    labels = [line[2:].split("  ")[0].strip() for line in rows]
    assert len(set(labels)) == 291
    assert "layers.31.post_attention_layernorm (RMSNorm)" in labels
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    assert "up to 6 steps per character" in "\n".join(lines)


def test_a_step_1_trip_folds_the_rows_that_are_nan_everywhere():
    history, model = deep_history(1, nan_from=17)
    for name in history.steps[0].grad_norms:
        history.steps[0].grad_norms[name] = math.nan
    lines = history_lines(history, model, finding_module="layers.17.mlp")
    assert sum("nan" in line for line in lines) <= 3, "\n".join(lines)
    folded = next(line for line in lines if "NaN/Inf in every step run" in line)
    assert "layers.0..31" in folded and "layers.17" in folded


def test_every_row_nan_leaves_the_folded_line_and_the_total():
    history, model = deep_history(1, nan_from=0)
    rec = history.steps[0]
    rec.activations = {name: math.nan for name in rec.activations}
    rec.grad_norms = {name: math.nan for name in rec.grad_norms}
    rec.grad_norm = math.nan
    lines = history_lines(history, model)
    assert lines[2].startswith("  NaN/Inf in every step run (both columns), 4 row(s): embed_tokens, layers.0..31,")
    assert lines[3].split() == ["total", "gradient", "norm", "nan", "nan", "!"]
    assert len(history_lines(history, model, full=True)) == 2 + 291 + 1 + 2  # full: every row, NaN or not


def test_grouped_rows_measure_the_whole_block():
    history, model = deep_history(2, grow_block=5)
    rows = {row.name: row for row in build_rows(history, model, finding_module=None)}
    assert rows["layers.5"].acts == [20.0, 200.0]  # max over the block's module outputs
    assert rows["layers.0..31"].acts == [20.0, 200.0]
    assert math.isclose(rows["layers.5"].grads[0], 0.5 * math.sqrt(9))  # L2 over its 9 parameters
    assert math.isclose(rows["layers.0..31"].grads[0], 0.5 * math.sqrt(9 * 32))


def test_short_labels_never_read_the_same():
    labels = [f"encoder.transformer_stack.layers.{k}.self_attention_block.query_projection (Linear)"
              for k in range(12)]
    shown = short_labels(labels, 50)
    assert len(set(shown)) == 12
    assert shown[3] == "encoder.….layers.3.….query_projection (Linear)"
    assert all(len(s) <= 50 for s in shown)
    same_tail = ["a.very_long_component_one.x (Linear)", "a.very_long_component_two.x (Linear)"]
    assert len(set(short_labels(same_tail, 20))) == 2  # eliding would merge them: both stay whole


def test_small_models_keep_one_row_per_module():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    history = History()
    for step in (1, 2):
        rec = history.begin(step)
        rec.activations = {"0": 1.0, "2": 2.0}
        rec.grad_norms = {"0.weight": 0.3, "0.bias": 0.4, "2.weight": 1.0, "2.bias": 0.0}
        rec.grad_norm = 1.0
    rows = build_rows(history, model)
    assert [(r.label, r.grads[0]) for r in rows] == [("0 (Linear)", 0.5), ("2 (Linear)", 1.0)]


def test_a_deep_root_sequential_is_one_family():
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(40)])
    history = History()
    for step in (1, 2):
        rec = history.begin(step)
        rec.activations = {str(k): 1.0 + (step * 50.0 if k == 7 else 0.0) for k in range(40)}
        rec.grad_norms = {f"{k}.weight": 0.1 for k in range(40)}
    rows = build_rows(history, model)  # in model order: the range, then the 3 that grew most (7, then ties)
    assert [r.label for r in rows] == ["0..39 (Linear x 40)", "0 (Linear)", "1 (Linear)", "7 (Linear)"]
    assert rows[3].acts == [51.0, 101.0]


def test_the_layout_read_back_from_json_gives_the_same_table_as_the_model():
    """Another process's model (a rank of `debug-nan run -- PROGRAM`) reaches the top process as its Layout in JSON,
    and its history as the report's: the table is the one the model itself gives, grouped blocks included."""
    history, model = deep_history(4, grow_block=7)
    layout = Layout(json.loads(json.dumps(Layout.of(model).modules)))
    again = History.from_dict(json.loads(json.dumps(history.to_dict())))
    assert history_lines(again, layout, finding_module="layers.9.mlp") == history_lines(
        history, model, finding_module="layers.9.mlp")
