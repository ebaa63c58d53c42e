"""The log's colours: only on a terminal, and never with NO_COLOR (presentation/log.py)."""


def test_no_colour_when_not_a_tty_or_no_color(monkeypatch):
    import io

    from debug_nan.presentation.log import Log

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    tty = Tty()
    Log(stream=tty)("x", "red")
    assert "\033[31m" in tty.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    tty = Tty()
    Log(stream=tty)("x", "red")
    assert tty.getvalue() == "x\n"
    plain = io.StringIO()
    Log(stream=plain)("x", "red")
    assert plain.getvalue() == "x\n"
