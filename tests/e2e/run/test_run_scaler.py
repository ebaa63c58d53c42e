"""`debug-nan run` on an fp16 loop with a GradScaler (CPU autocast): its overflow steps are skipped as usual, not
findings; a NaN loss after them is."""

SCALER = """import torch
from tests.support import models

torch.manual_seed(0)
model = models.Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)  # scaled gradients overflow float16 at first
for batch in models.batches(labels=True, empty_at=(5,)):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = models.regression_loss(model, batch)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    print(scaler.get_scale())
"""


def test_scaler_overflow_steps_are_skipped_and_the_nan_after_them_is_found(tmp_path, run_here):
    (tmp_path / "scaler.py").write_text(SCALER)
    done, stdout, stderr = run_here("python", "scaler.py")
    assert done.code == 1, done.output
    assert stdout.split() == [str(2.0 ** k) for k in range(39, 34, -1)]  # halved 5 times: 5 skipped steps
    assert stderr.count("taken for the GradScaler's overflow") == 5
    assert [h["scaler_skipped"] for h in done.report["history"]] == [True] * 5 + [False]
    first = done.first
    assert (first["step"], first["micro_step"], first["phase"], first["module"], first["op"], first["cause"]) == (
        6, 1, "forward", "attn", "aten._softmax.default", "all_masked_softmax")
