"""The application: what the user runs. cli.py (+ cli_options.py, cli_help.py): options, usage errors and exit
codes, the only place that prints an error and exits ; job.py (a CLI job: settings -> task -> Trainer ->
presentation) with job_settings.py (its settings: the components composed, the TOML config, the flat record) ;
run_job.py (`debug-nan run`'s spine: the command watched -> its Ending -> finish) with run_watch.py (the
hooks' listener, the RunDriver, the command run here), run_options.py (its options, in every watched process),
command.py (the user's command: Python run in this process, or a program), run_program.py (a program run as a
child, and the one answer of all its watched processes: no torch in that process),
run_folder.py (the run's private folder: the start-up hook, the processes' results), run_hook.py (the watch in a
process the start-up hook attached in), run_paths.py (outputs never over the command's files) and
script_errors.py (whose error the command's exception is, and its traceback as Python shows it) ; replay.py
(`debug-nan replay BUNDLE`)."""
