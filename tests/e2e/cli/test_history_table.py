"""The per-layer history table of a real run: the growth before an explosion shows in the log."""


from tests.conftest import SCENARIOS


def test_history_table_shows_growth_before_the_explosion(run_cli, tmp_path):
    plot = tmp_path / "h.png"
    run = run_cli("--task", f"{SCENARIOS}:high_lr", "--lr", "3", "--max-steps", "10", "--device", "cpu",
                  "--plot", str(plot))
    assert run.code == 1 and run.first["cause"] == "gradient_explosion"
    table = run.output.split("HISTORY")[1].split("SUMMARY")[0]
    row = next(line for line in table.splitlines() if line.strip().startswith("layers.6 (Linear)"))
    assert "▁█" in row  # the gradient norm of the last layer jumped between the two steps
    assert "total gradient norm" in table
    assert plot.stat().st_size > 5000 and plot.read_bytes()[:4] == b"\x89PNG"
    assert run.output.index("HISTORY") < run.output.index("SUMMARY")  # the summary stays the last block
