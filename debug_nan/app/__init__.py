"""The application: what the user runs. cli.py (+ cli_options.py, cli_help.py): options, usage errors and exit
codes, the only place that prints an error and exits ; job.py (a CLI job: settings -> task -> Trainer ->
presentation) ; run_job.py (`debug-nan run`: the command, the hooks, the RunDriver, the outputs) with command.py
(the user's command, run in this process) and run_paths.py (outputs never over the command's files) ; replay.py
(`debug-nan replay BUNDLE`)."""
