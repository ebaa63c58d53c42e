"""The job's out-of-memory message names the sizes in use, not a guess (app/job.py)."""

from __future__ import annotations


def test_out_of_memory_message_names_the_sizes_not_a_guess():
    from debug_nan.app.job import oom_message
    from debug_nan.app.job_settings import JobSettings

    s = JobSettings.from_flat(dict(batch_size=2, token_limit=4096, heads=4))
    # the sample-level attention scores: 2 x 4 x 4096 x 4096 x 4 bytes = 512 MiB
    text = oom_message(RuntimeError("CPU: Tried to allocate 512.00 MiB"), s, None)
    assert "sample-level attention scores [batch 2 x 4 heads x token limit 4096 x 4096] = 512.00 MiB" in text
    assert "The failed allocation is the size of the sample-level attention scores." in text
    assert "--batch-size" not in text  # already the smallest (UniFrac needs pairs)
    assert "lower --token-limit (now 4096)" in text
