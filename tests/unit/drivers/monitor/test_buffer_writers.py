"""The Monitor names the op that wrote a non-finite buffer, as the CLI does (tests/e2e/cli/test_state_bugs.py):
the glue lives in the step session."""

import pytest


def test_the_monitor_names_the_buffer_writer_too():
    """The glue lives in the step session: the API's Monitor gets the same finding as the CLI."""
    import torch

    import debug_nan
    from tests.support.state_bugs import vqvae_ema_dead_code

    t = vqvae_ema_dead_code()
    opt = torch.optim.AdamW(t.model.parameters(), lr=1e-4)
    monitor = debug_nan.Monitor(t.model, t.loss, opt)
    with pytest.raises(debug_nan.NonFiniteError) as info:
        for batch in t.batches:
            with monitor.step(batch):
                t.loss(t.model, batch).backward()
            opt.step()
            opt.zero_grad()
    f = info.value.finding
    assert (f.step, f.micro_step, f.module, f.op, f.cause) == (1, 1, "vq", "aten.div.Tensor", "div_by_zero")
    assert "wrote buffer `vq.embed` at step 1" in f.explanation
