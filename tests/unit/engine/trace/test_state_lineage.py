"""NaN that lives in state: ops that write buffers without saying so in their schema (batch norm's running
statistics), buffers poisoned in one step and harmful in a later one."""

import pytest
import torch
from torch import nn

from debug_nan.engine.explain.diagnose import diagnose
from debug_nan.engine.trace.events import op_info
from debug_nan.engine.trace.tracer import Tracer
from debug_nan.engine.watch.watch import Watch
from tests.unit.engine.watch.test_watch_syncs import HostSyncs


def _conv_bn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(36, 1))


def test_batch_norm_declares_its_running_statistics_written():
    info = op_info(torch.ops.aten.native_batch_norm.default)
    assert info.mutable and info.written == {"running_mean", "running_var"}
    assert op_info(torch.ops.aten.convolution.default).written == frozenset()


def test_inf_into_a_training_batch_norm_names_the_convolution_not_the_buffer():
    """Sample 0 is 1e36 and channel 1's weights 1e4: the convolution overflows float32 (about 1e40 in float64).
    The BatchNorm then writes NaN into running_mean/var itself; judged before that write, the buffers were
    finite, so the origin is the convolution's Inf and the BatchNorm's NaN (inf - inf) descends from it."""
    model = _conv_bn()
    with torch.no_grad():
        model[0].weight[1] *= 1e4
    x = torch.randn(4, 2, 5, 5)
    x[0] *= 1e36
    with Tracer(model) as tracer:
        loss = model(x).pow(2).mean()
        origin = tracer.origin_of([loss])
    assert torch.isnan(loss) and torch.isnan(model[1].running_var[1])
    assert [(e.op, e.kind, e.label) for e in tracer.origins] == [
        ("aten.convolution.default", "inf", None), ("aten.native_batch_norm.default", "nan", None)]
    assert (origin.op, origin.module, origin.kind) == ("aten.convolution.default", "0", "inf")
    assert diagnose(origin)[0] == "overflow"
    # the buffers carry the convolution's lineage: a later step that meets them can be traced back here
    for buffer in (model[1].running_mean, model[1].running_var):
        assert tracer.origin_of(buffer) is origin


def test_eval_mode_batch_norm_with_a_finite_input_leaves_its_buffers_alone():
    model = _conv_bn().eval()
    with Tracer(model) as tracer:
        model(torch.randn(4, 2, 5, 5)).sum()
    assert tracer.origins == [] and len(tracer.lineage) == 0


def _watched_bn():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    model.register_buffer("causal", torch.tensor([0.0, float("-inf")]))  # non-finite from the start, by design
    return model, Watch(model)


def test_watch_reports_buffers_that_turn_non_finite_once_in_one_sync():
    model, watch = _watched_bn()
    seen = []
    for i in range(4):
        x = torch.randn(5, 3)
        if i == 2:
            x[0, 1] = float("inf")  # the BatchNorm writes Inf into running_mean[1] and NaN into running_var[1]
        with torch.no_grad():
            model(x)
        with HostSyncs() as syncs:
            result = watch.sync()
        assert syncs.count == 1, syncs.what
        seen.append([(c.name, c.nonfinite) for c in result.new_nonfinite_buffers])
        assert result.harm() is None  # a buffer alone is not harm
    assert seen == [[], [], [("1.running_mean", "inf"), ("1.running_var", "nan")], []]


def test_a_buffer_that_turns_finite_again_and_then_non_finite_is_reported_again():
    model, watch = _watched_bn()
    model[1].running_var[0] = float("nan")
    assert [c.name for c in watch.sync().new_nonfinite_buffers] == ["1.running_var"]
    model[1].running_var[0] = 1.0
    assert watch.sync().new_nonfinite_buffers == []
    model[1].running_var[0] = float("inf")
    assert [(c.name, c.nonfinite) for c in watch.sync().new_nonfinite_buffers] == [("1.running_var", "inf")]


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("scale", torch.tensor([1.0, float("inf")]))

    def forward(self, x):
        return self.lin(x) * self.scale


@pytest.mark.parametrize("poisoned, deliberate", [(frozenset(), True), (frozenset({"scale"}), False)])
def test_an_inf_buffer_the_run_saw_turn_inf_is_no_deliberate_mask(poisoned, deliberate):
    model = Scaled()
    with Tracer(model, poisoned=poisoned) as tracer:
        loss = model(torch.ones(3, 2)).sum()
        origin = tracer.origin_of(loss)
    assert origin.label == "buffer `scale`" and origin.deliberate is deliberate


def test_a_training_step_of_a_batchnorm_model_keeps_one_sync_per_micro_batch():
    import io
    import itertools

    from debug_nan.drivers.task import Task
    from debug_nan.drivers.trainer.loop import Trainer
    from debug_nan.presentation.log import Log
    from debug_nan.app.job_settings import build_settings

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
    g = torch.Generator().manual_seed(1)
    batches = [{"x": torch.randn(5, 6, generator=g), "y": torch.randn(5, 1, generator=g)} for _ in range(3)]
    task = Task(model=model, batches=batches, loss=lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(),
                optimizer=lambda p: torch.optim.SGD(p, lr=1e-2))
    trainer = Trainer(task, build_settings(None, {"device": "cpu", "gradient_accumulation_steps": 2}),
                      Log(stream=io.StringIO()))
    stream = itertools.cycle(task.batches)
    for step in range(1, 4):
        with HostSyncs() as syncs:
            finding = trainer.train_step(step, stream)
        assert finding is None and syncs.count == 2, syncs.what
