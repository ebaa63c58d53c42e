"""The application: what the user runs. cli.py (+ cli_options.py, cli_help.py): options, usage errors and exit
codes, the only place that prints an error and exits ; job.py (a CLI job: settings -> task -> Trainer ->
presentation) ; run_job.py (`debug-nan run`: the command, the hooks, the RunDriver, the outputs) with command.py
(the user's command, run in this process), run_paths.py (outputs never over the command's files) and
script_errors.py (whose error the command's exception is, and its traceback as Python shows it) ; replay.py
(`debug-nan replay BUNDLE`)."""
