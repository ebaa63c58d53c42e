"""--snapshot host | device | params | off: where the copies live, the round trip in each mode, and what `off`
keeps (through the CLI: tests/e2e/cli/test_snapshot_modes.py)."""

import pytest
import torch

from debug_nan.engine.replay.snapshot import SNAPSHOT_MODES, Snapshot
from tests.unit.engine.replay.test_snapshot import Net, assert_same, same, state_of, train_one_step

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def trained(device: str = "cpu"):
    torch.manual_seed(0)
    model = Net().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 0.5 ** i)
    return model, optimizer, scheduler


def step_on(model, optimizer, scheduler, device):
    x = torch.randn(8, 4, device=device)
    model(x).pow(2).mean().backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("mode", ["host", "device"])
def test_round_trip_in_each_mode(mode):
    model, optimizer, scheduler = trained()
    train_one_step(model, optimizer, scheduler)
    snapshot = Snapshot(model, optimizer, None, scheduler, mode=mode)
    snapshot.save()
    before = state_of(model, optimizer, scheduler)
    for _ in range(2):
        train_one_step(model, optimizer, scheduler)
    assert not same(before["params"], state_of(model, optimizer, scheduler)["params"])
    snapshot.restore()
    assert_same(state_of(model, optimizer, scheduler), before)
    # on the CPU both modes keep plain CPU copies of 23 parameters + 7 buffers values + 2 x 23 AdamW moments
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    state_steps = sum(4 for p in model.parameters())  # AdamW's float32 `step` per parameter
    assert snapshot.nbytes == (0, 3 * 4 * params + buffers + state_steps)
    assert "host and device are the same memory" in snapshot.describe()


def test_off_keeps_nothing_and_cannot_restore():
    model, optimizer, scheduler = trained()
    snapshot = Snapshot(model, optimizer, None, scheduler, mode="off")
    snapshot.save()
    train_one_step(model, optimizer, scheduler)
    assert not snapshot.kept and snapshot.nbytes == (0, 0)
    with pytest.raises(RuntimeError, match="--snapshot off"):
        snapshot.restore()
    assert snapshot.describe().startswith("off: no copy")


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="host, device, params, off"):
        Snapshot(Net(), mode="disk")
    assert SNAPSHOT_MODES == ("host", "device", "params", "off")


@cuda
@pytest.mark.parametrize("mode", ["host", "device"])
def test_cuda_round_trip_and_where_the_copies_live(mode):
    model, optimizer, scheduler = trained("cuda")
    step_on(model, optimizer, scheduler, "cuda")
    snapshot = Snapshot(model, optimizer, None, scheduler, mode=mode)
    snapshot.save()
    before = state_of(model, optimizer, scheduler)
    for _ in range(3):  # the optimizer's pre-hook waits for the side-stream copy before writing the parameters
        step_on(model, optimizer, scheduler, "cuda")
    snapshot.restore()
    assert_same(state_of(model, optimizer, scheduler), before)
    on_gpu, on_cpu = snapshot.nbytes
    if mode == "host":
        assert on_gpu == 0 and all(c.is_pinned() for c in snapshot._param_copies.copies)
        assert "pinned" in snapshot.describe()
    else:
        assert on_gpu > 0 and snapshot.describe().startswith("device: copies in cuda")


@cuda
def test_cuda_host_save_does_not_wait_for_the_copy():
    """save() queues the copy on a side stream and returns; the compute stream waits on its event only when the
    optimizer steps (or restore() runs)."""
    model, optimizer, scheduler = trained("cuda")
    step_on(model, optimizer, scheduler, "cuda")
    snapshot = Snapshot(model, optimizer, None, scheduler, mode="host")
    snapshot.save()
    assert snapshot._pending == {next(model.parameters()).device}
    step_on(model, optimizer, scheduler, "cuda")
    assert not snapshot._pending


@cuda
def test_cuda_host_without_an_optimizer_copies_in_stream_order():
    """Nobody fences a side-stream copy when there is no optimizer step: the copy is queued on the compute stream."""
    model = Net().cuda()
    snapshot = Snapshot(model, mode="host")
    snapshot.save()
    assert not snapshot._pending
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    snapshot.restore()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_params_mode_copies_no_optimizer_state_and_leaves_it_alone():
    model, optimizer, scheduler = trained("cpu")
    snapshot = Snapshot(model, optimizer, None, scheduler, mode="params")
    snapshot.save()
    weights = [p.detach().clone() for p in model.parameters()]
    state = {k: v.clone() for k, v in optimizer.state[next(model.parameters())].items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    snapshot.restore()
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))
    live = optimizer.state[next(model.parameters())]
    assert all(torch.equal(live[k], v) for k, v in state.items())  # untouched: unchanged within a step
    assert snapshot._state is None or not snapshot._state.copies
