"""Backward calls of real scripts' shapes through `debug-nan run`: several losses in one call, the script's own
anomaly mode, training in a thread. Each script alone in a fresh process (the reference) and watched in this one."""

from tests.support.run.script_runs import alone, write

TWO_LOSSES = """
    import sys
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    bad_step = int(sys.argv[1]) if len(sys.argv) > 1 else -1
    for step in range(4):
        out = model(torch.ones(3, 4))
        fit = out[:, 0].pow(2).mean()
        # a penalty with a logged constant part: at bad_step that part is NaN, its gradient stays finite
        penalty = out[:, 1].mean() * 0.01 + torch.tensor(float("nan") if step == bad_step else 0.5)
        torch.autograd.backward([fit, penalty])
        optimizer.step()
        optimizer.zero_grad()
        print(step, f"{fit.item():.5f}", f"{penalty.item():.5f}")
"""


def test_a_nan_in_the_second_loss_of_one_backward_call_is_found(tmp_path, run_here):
    script = write(tmp_path, TWO_LOSSES)
    healthy, stdout, stderr = run_here("python", script.name)
    assert healthy.code == 0 and stdout == alone(script).stdout, stderr
    report = healthy.report
    assert (report["status"], report["steps_run"]) == ("clean", 4)
    plain = alone(script, "2")
    assert "2 0.00000 nan" in plain.stdout and plain.returncode == 0
    done, stdout, stderr = run_here("python", script.name, "2")
    assert done.code == 1, stderr
    first = done.first
    assert (first["step"], first["micro_step"], first["phase"]) == (3, 1, "loss")
    assert first["source"].startswith("script.py:13")
    assert stdout == "".join(plain.stdout.splitlines(keepends=True)[:2])


ANOMALY = """
    import sys
    import torch

    torch.manual_seed(0)
    torch.autograd.set_detect_anomaly(True)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    bad_step = int(sys.argv[1]) if len(sys.argv) > 1 else -1
    for step in range(4):
        out = model(torch.ones(3, 4))
        spread = out - out.detach() if step == bad_step else out  # 0 at bad_step: sqrt's gradient is infinite
        loss = spread.abs().sqrt().sum() + out.pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(step, f"{loss.item():.5f}")
"""


def test_the_scripts_own_anomaly_mode_gets_the_usual_finding(tmp_path, run_here):
    script = write(tmp_path, ANOMALY)
    healthy, stdout, stderr = run_here("python", script.name)
    assert healthy.code == 0 and stdout == alone(script).stdout, stderr
    report = healthy.report
    assert report["status"] == "clean"
    plain = alone(script, "2")
    assert plain.returncode == 1 and "returned nan values" in plain.stderr  # anomaly mode's own error, alone
    done, stdout, stderr = run_here("python", script.name, "2")
    assert done.code == 1, stderr
    first = done.first
    assert (first["step"], first["phase"], first["cause"]) == (3, "backward", "grad_at_singularity")
    assert first["source"].startswith("script.py:13")  # the sqrt
    assert "Traceback" not in stderr and "debug_nan" not in stderr
    assert stdout == plain.stdout


THREAD = """
    import sys
    import threading
    import torch

    torch.manual_seed(0)
    bad_step = int(sys.argv[1]) if len(sys.argv) > 1 else -1

    def train():
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(4):
            x = torch.ones(3, 4) * (1e30 if step == bad_step else 1.0)
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            print(step, f"{loss.item():.5f}")

    worker = threading.Thread(target=train)
    worker.start()
    worker.join()
    print("trained")
"""


def test_a_trip_in_a_training_thread_stops_the_script(tmp_path, run_here):
    script = write(tmp_path, THREAD)
    healthy, stdout, stderr = run_here("python", script.name)
    assert healthy.code == 0 and stdout == alone(script).stdout, stderr
    report = healthy.report
    assert (report["status"], report["steps_run"]) == ("clean", 4)
    plain = alone(script, "2")
    assert plain.returncode == 0 and plain.stdout.endswith("trained\n")
    done, stdout, stderr = run_here("python", script.name, "2")
    assert done.code == 1, stderr
    first = done.first
    assert (first["step"], first["phase"], first["op"], first["cause"]) == (3, "loss", "aten.pow.Tensor_Scalar",
                                                                            "overflow")
    assert stdout == "".join(plain.stdout.splitlines(keepends=True)[:2])  # the main thread did not run on
    assert "Exception in thread" not in stderr and "RunStopped" not in stderr
