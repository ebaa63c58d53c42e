"""Errors the user can fix: each carries a one-paragraph message and maps to exit code 2."""


class InputError(Exception):
    """Bad usage or bad input (a file, a sample, an option). The CLI prints the message and exits 2."""

    exit_code = 2
