"""README.md and docs/*.md say only what the repository has: every relative link (and its #anchor) and every repo
path named in code resolves; every `debug-nan ...` command in code uses options the CLI has, read from its Click
command objects, with valid values; every `python scripts/X.py ...` uses a script that exists and options its
argparse parser declares (read from its source); docs/options.md lists every option of the CLI and its TOML tables
as the settings define them; the README stays a front door (at most 230 lines). Static: no command is run."""

from __future__ import annotations

import ast
import importlib
import re
import shlex
import sys
from functools import lru_cache
from pathlib import Path

import click
import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]


def _console_script() -> click.Command:
    """The `debug-nan` Click command, found where pyproject.toml's [project.scripts] says (modules may move)."""
    target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["debug-nan"]
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


CLI = _console_script()
# the config tables: from the settings module the CLI imported, wherever it lives
SECTIONS = next(module.SECTIONS for name, module in sorted(sys.modules.items())
                if name.startswith("debug_nan") and isinstance(getattr(module, "SECTIONS", None), dict)
                and "train" in module.SECTIONS)
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 230

# a path in code that names something in this repository (other paths in code are the user's: train.py, runs/...)
REPO_PATH = re.compile(r"^(?:\./)?(?:(?:scripts|tests|configs|data|docs|debug_nan|\.ci)(?:/[\w.*-]*)*"
                       r"|README\.md|ARCHITECTURE\.md|constraints\.txt|pyproject\.toml)$")
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*(?:\.[a-z]+)?|\.\.\.)$")  # N, PATH, FILE.toml, R.json, ...
DEVICE = re.compile(r"^(?:auto|cpu|cuda(?::(?:\d+|N))?)$")
SHELL_STOP = re.compile(r"^(?:\||\|\||&&|;|&|\\|[0-9&]?>.*|<.*)$")


# -- reading the pages ----------------------------------------------------------------------------------------------
def code_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, text) of every line in a fenced or an indented code block, backslash continuations joined."""
    out, fenced, previous_blank, previous_code = [], False, True, False
    lines = page.read_text().splitlines()
    pending, start = "", 0
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fenced, previous_code = not fenced, False
            continue
        indented = not fenced and line.startswith("    ") and (previous_blank or previous_code)
        if fenced or indented:
            text = line[4:] if indented else line
            if not pending:
                start = number
            if text.rstrip().endswith("\\"):
                pending += text.rstrip()[:-1] + " "
            else:
                out.append((start, pending + text))
                pending = ""
        previous_code = indented
        previous_blank = not line.strip()
    return out


def prose(page: Path) -> str:
    """The page with its code blocks blanked out (line numbers kept)."""
    code = {number for number, _ in code_lines(page)}
    lines, fenced = page.read_text().splitlines(), False
    kept = []
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            kept.append("")
            continue
        kept.append("" if fenced or number in code else line)
    return "\n".join(kept)


def inline_code(page: Path) -> list[tuple[int, str]]:
    """(line number, text) of every inline code span outside the code blocks."""
    text = prose(page)
    return [(text.count("\n", 0, m.start()) + 1, m.group(2).replace("\n", " ").strip())
            for m in re.finditer(r"(`+)([^`]+?)\1", text)]


def snippets(page: Path) -> list[tuple[str, str]]:
    """(where, text) of every piece of code on the page: code-block lines and inline spans."""
    return [(f"{page.relative_to(REPO)}:{number}", text)
            for number, text in [*code_lines(page), *inline_code(page)]]


def words(text: str) -> list[str]:
    try:
        return shlex.split(text.replace("$(which debug-nan)", "debug-nan"), comments=True)
    except ValueError:  # an unbalanced quote in a log excerpt
        return text.replace("$(which debug-nan)", "debug-nan").split()


def arguments(tokens: list[str]) -> list[str]:
    """The words up to the first shell operator (a pipe, a redirection, &&), usage brackets taken off."""
    out = []
    for token in tokens:
        if SHELL_STOP.match(token):
            break
        token = token.strip("[]") if token.startswith("[") or token.endswith("]") else token
        if token:
            out.append(token)
    return out


# -- the CLI's options ----------------------------------------------------------------------------------------------
def cli_commands() -> dict[str, click.Command]:
    return {"debug-nan": CLI, **{f"debug-nan {name}": command for name, command in CLI.commands.items()}}


def option_names(command: click.Command) -> set[str]:
    names = {"-h", "--help"}
    for param in command.params:
        if isinstance(param, click.Option):
            names.update(param.opts, param.secondary_opts)
    return names


def find_option(command: click.Command, name: str) -> click.Option | None:
    for param in command.params:
        if isinstance(param, click.Option) and name in (*param.opts, *param.secondary_opts):
            return param
    return None


def check_value(option: click.Option, value: str | None, where: str, said: str) -> None:
    assert value is not None, f"{where}: `{said}`: {option.opts[0]} needs a value"
    if PLACEHOLDER.match(value):
        return
    if isinstance(option.type, click.Choice):
        assert value in option.type.choices, \
            f"{where}: `{said}`: {option.opts[0]} {value!r} is not one of {', '.join(option.type.choices)}"
    elif isinstance(option.type, (click.types.IntParamType, click.types.FloatParamType)):
        try:
            option.type.convert(value, option, None)
        except click.BadParameter as exc:
            raise AssertionError(f"{where}: `{said}`: {option.opts[0]} {value!r}: {exc.message}") from None
    elif option.name == "device":
        assert DEVICE.match(value), f"{where}: `{said}`: --device {value!r} is not auto, cpu, cuda or cuda:N"
    elif option.name == "task":
        check_task(value, where)


def check_task(value: str, where: str) -> None:
    """A task in this repository (FILE.py:NAME) names a file that exists and a function it defines."""
    path, _, name = value.rpartition(":")
    if not REPO_PATH.match(path):
        return  # the user's own (my_task.py:build)
    assert (REPO / path).is_file(), f"{where}: --task {value}: no file {path}"
    defined = {node.name for node in ast.parse((REPO / path).read_text()).body
               if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert name in defined, f"{where}: --task {value}: {path} defines no `{name}`"


def check_debug_nan(args: list[str], where: str, said: str) -> int:
    """Check one `debug-nan ARGS` against the Click commands; returns how many options it used."""
    command, name = CLI, "debug-nan"
    if args and args[0] in CLI.commands:
        command, name, args = CLI.commands[args[0]], f"debug-nan {args[0]}", args[1:]
    interspersed = command.allow_interspersed_args
    used, i = 0, 0
    while i < len(args):
        token = args[i]
        if token == "--":
            break
        if not token.startswith("-") or token == "-":
            if not interspersed:
                break  # `run`: the first word that is not an option starts the command
            i += 1
            continue
        flag, eq, value = token.partition("=")
        assert flag in option_names(command), f"{where}: `{said}`: {name} has no option {flag}"
        used += 1
        option = find_option(command, flag)
        if option is None or option.is_flag or option.count:
            i += 1
            continue
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else None
            i += 1
        check_value(option, value, where, said)
        i += 1
    return used


def debug_nan_commands(text: str) -> list[list[str]]:
    """The argument lists of every `debug-nan ...`, `python -m debug_nan ...`, `torchrun ... -m debug_nan ...` in a
    piece of code (also inside a quoted command, as ssh's)."""
    tokens = words(text)
    found = []
    for i, token in enumerate(tokens):
        if " " in token and ("debug-nan" in token or "debug_nan" in token):
            found += debug_nan_commands(token)
        elif token.strip("()") == "debug-nan":
            found.append(arguments([t.rstrip(")") for t in tokens[i + 1:]]))
        elif token == "-m" and i + 1 < len(tokens) and tokens[i + 1] == "debug_nan":
            found.append(arguments(tokens[i + 2:]))
    return found


# -- the scripts' options -------------------------------------------------------------------------------------------
def _literal_names(node: ast.AST, tree: ast.Module, folder: Path) -> list[str] | None:
    """The strings a choices= expression holds: a literal, or `(*NAME, ...)` with NAME a module-level dict/tuple
    here or in the sibling script it is imported from; None when it cannot be read."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        out = []
        for element in node.elts:
            if isinstance(element, ast.Constant):
                out.append(element.value)
            elif isinstance(element, ast.Starred) and isinstance(element.value, ast.Name):
                names = _module_names(element.value.id, tree, folder)
                if names is None:
                    return None
                out += names
            else:
                return None
        return out
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "tuple" and node.args \
            and isinstance(node.args[0], ast.Name):
        return _module_names(node.args[0].id, tree, folder)
    return None


def _module_names(name: str, tree: ast.Module, folder: Path) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
            if isinstance(value, ast.Dict):
                return [k.value for k in value.keys if isinstance(k, ast.Constant)]
            return _literal_names(value, tree, folder)
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
            source = folder / f"{node.module}.py"
            if source.is_file():
                return _module_names(name, ast.parse(source.read_text()), folder)
    return None


@lru_cache(maxsize=None)
def script_options(path: Path) -> dict[str, dict]:
    """{option: {"flag": bool, "choices": [...] | None}} of a script's argparse parser, read from its source (the
    f-string options of a `for NAME, ... in (literal)` loop expanded); -h/--help always."""
    tree = ast.parse(path.read_text())
    options = {"-h": {"flag": True, "choices": None}, "--help": {"flag": True, "choices": None}}
    loops = {}
    for loop in ast.walk(tree):
        if isinstance(loop, ast.For):
            for inner in ast.walk(loop):
                loops.setdefault(id(inner), loop)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = []
        for arg in node.args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names.append(arg.value)
            elif isinstance(arg, ast.JoinedStr) and id(node) in loops:
                names += _expand(arg, loops[id(node)])
        keywords = {k.arg: k.value for k in node.keywords}
        action = keywords.get("action")
        flag = isinstance(action, ast.Constant) and action.value in ("store_true", "store_false", "count")
        choices = _literal_names(keywords["choices"], tree, path.parent) if "choices" in keywords else None
        for name in names:
            if name.startswith("-"):
                options[name] = {"flag": flag, "choices": choices}
    return options


def _expand(fstring: ast.JoinedStr, loop: ast.For) -> list[str]:
    """f"--{name}" inside `for name, default in ((...), ...)`: one option per element of the loop's literal."""
    targets = [t.id for t in (loop.target.elts if isinstance(loop.target, ast.Tuple) else [loop.target])
               if isinstance(t, ast.Name)]
    try:
        items = ast.literal_eval(loop.iter)
    except ValueError:
        return []
    out = []
    for item in items:
        values = dict(zip(targets, item if isinstance(loop.target, ast.Tuple) else (item,)))
        text = ""
        for part in fstring.values:
            if isinstance(part, ast.Constant):
                text += part.value
            elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) \
                    and part.value.id in values:
                text += str(values[part.value.id])
            else:
                return []
        out.append(text)
    return out


def getopts_spec(path: Path) -> dict[str, bool]:
    """{-x: takes a value} of a shell script's `getopts "x:y"`."""
    match = re.search(r'getopts "([^"]+)"', path.read_text())
    spec = match.group(1) if match else ""
    return {f"-{letter}": spec[i + 1:i + 2] == ":" for i, letter in enumerate(spec) if letter != ":"}


def check_shell_command(script: str, args: list[str], where: str, said: str) -> int:
    """A shell script's own options against its getopts; the arguments it passes on to debug-nan (the quickstart:
    all; remote_debug.sh: those after `--`) against the CLI."""
    path = REPO / script
    assert path.is_file(), f"{where}: `{said}`: no script {script}"
    if script not in PASSES_ON:
        return 0
    spec, i = getopts_spec(path), 0
    while spec and i < len(args) and args[i] != "--":
        token = args[i]
        if re.fullmatch(r"-[A-Za-z]", token):
            assert token in spec, f"{where}: `{said}`: {script} has no option {token}"
            i += 1 + spec[token]
        else:
            i += 1
    passed = args[i + 1:] if spec else args
    return check_debug_nan(passed, where, said)


PASSES_ON = ("scripts/quickstart.sh", "scripts/remote_debug.sh")  # (test.sh passes its arguments on to pytest)


def check_script_command(script: str, args: list[str], where: str, said: str) -> int:
    path = REPO / script
    assert path.is_file(), f"{where}: `{said}`: no script {script}"
    options, used, i = script_options(path), 0, 0
    while i < len(args):
        token = args[i]
        if token == "--":
            break
        if not token.startswith("-"):
            i += 1
            continue
        flag, eq, value = token.partition("=")
        assert flag in options, \
            f"{where}: `{said}`: {script} has no option {flag} (it has {', '.join(sorted(options))})"
        used += 1
        spec = options[flag]
        if not spec["flag"]:
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else None
                i += 1
            assert value is not None, f"{where}: `{said}`: {script} {flag} needs a value"
            if spec["choices"] is not None and not PLACEHOLDER.match(value):
                assert value in spec["choices"], \
                    f"{where}: `{said}`: {script} {flag} {value!r} is not one of {', '.join(map(str, spec['choices']))}"
        i += 1
    return used


def script_commands(text: str) -> list[tuple[str, list[str]]]:
    """(script, its arguments) of every `python scripts/X.py ...`, `bash scripts/X.sh ...` or `scripts/X.sh ...`."""
    tokens = words(text)
    found = []
    for i, token in enumerate(tokens):
        path = token[2:] if token.startswith("./") else token
        if not re.fullmatch(r"scripts/[\w.-]+\.(?:py|sh)", path):
            continue
        before = tokens[i - 1] if i else ""
        if path.endswith(".py") and before in ("python", "python3"):
            found.append((path, arguments(tokens[i + 1:])))
        elif path.endswith(".sh") and (before in ("", "bash", "sh") or SHELL_STOP.match(before)):
            found.append((path, arguments(tokens[i + 1:])))
    return found


# -- the tests ------------------------------------------------------------------------------------------------------
def github_anchors(page: Path) -> set[str]:
    """The #anchors GitHub makes of a page's headings (lower case, punctuation dropped, spaces to hyphens, -N for
    repeats)."""
    anchors, seen = set(), {}
    for line in prose(page).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        anchors.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_and_repo_path_exists(page):
    text = prose(page)
    for match in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = match.group(1)
        where = f"{page.relative_to(REPO)}:{text.count(chr(10), 0, match.start()) + 1}"
        if re.match(r"^[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve() if file else page
        assert resolved.exists(), f"{where}: the link ({target}) leads nowhere"
        if anchor and resolved.suffix == ".md":
            assert anchor in github_anchors(resolved), \
                f"{where}: ({target}): {resolved.relative_to(REPO)} has no heading #{anchor}"
    for where, text in snippets(page):
        for token in words(text):
            token = token.strip("()[],;'\"").rstrip(".:")
            path = re.sub(r":[\w.]*$", "", token)  # tests/support/scenarios.py:high_lr, docs/examples/train.py:33
            if REPO_PATH.match(path) and "*" not in path:
                assert (REPO / path).exists(), f"{where}: `{text}` names {path}, which is not in the repository"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_uses_real_options(page):
    """`debug-nan ...` (and the debug-nan arguments after `--` of the quickstart and remote_debug.sh) against the
    Click commands; `python scripts/X.py ...` against the script's parser; `scripts/X.sh -o` against its getopts."""
    for where, text in snippets(page):
        for args in debug_nan_commands(text):
            check_debug_nan(args, where, text)
        for script, args in script_commands(text):
            if script.endswith(".py"):
                check_script_command(script, args, where, text)
                continue
            check_shell_command(script, args, where, text)


def test_every_cli_option_is_in_the_options_page():
    page = REPO / "docs" / "options.md"
    spans = " ".join(text for _, text in inline_code(page)) + " " + "\n".join(t for _, t in code_lines(page))
    named = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", spans))
    for label, command in cli_commands().items():
        missing = sorted(option_names(command) - named)
        assert not missing, f"docs/options.md does not list {', '.join(missing)} of `{label}`"
    every = set().union(*(option_names(command) for command in cli_commands().values()))
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("| `-"):
            for flag in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", line.split("|")[1]):
                assert flag in every, f"docs/options.md:{number}: {flag} is not an option of debug-nan"


def test_the_options_page_has_the_config_tables_of_the_settings():
    rows = {}
    for line in (REPO / "docs" / "options.md").read_text().splitlines():
        match = re.match(r"^\| `\[(\w+)\]` \| (.*) \|$", line)
        if match:
            rows[match.group(1)] = tuple(re.findall(r"`(\w+)`", match.group(2)))
    assert rows == {table: tuple(keys) for table, keys in SECTIONS.items()}


def test_the_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    code = {text.strip() for _, text in code_lines(REPO / "README.md")}
    assert "bash scripts/quickstart.sh" in code and "bash scripts/test.sh" in code  # CI runs the README's command
    first = next(text for _, text in code_lines(REPO / "README.md"))
    assert first.startswith("debug-nan run -- "), "the README's first command is `debug-nan run -- <command>`"
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in "\n".join(lines), f"the README does not link docs/{page.name}"


def test_the_checks_catch_what_they_should():
    """The checks above can fail: a made-up option, a bad choice or value, a made-up script option, a task the
    file does not define, a made-up option of remote_debug.sh or of the debug-nan arguments it passes on."""
    with pytest.raises(AssertionError, match="has no option --no-such-option"):
        check_debug_nan(["run", "--no-such-option", "--", "python", "train.py"], "x", "x")
    with pytest.raises(AssertionError, match="is not one of"):
        check_debug_nan(["--precision", "fp8"], "x", "x")
    with pytest.raises(AssertionError, match="needs a value|is not"):
        check_debug_nan(["--max-steps", "ten"], "x", "x")
    with pytest.raises(AssertionError, match="has no option --fast"):
        check_script_command("scripts/bench_run.py", ["--fast"], "x", "x")
    with pytest.raises(AssertionError, match="is not one of"):
        check_script_command("scripts/bench_overhead.py", ["--model", "llama"], "x", "x")
    with pytest.raises(AssertionError, match="defines no"):
        check_task("tests/support/scenarios.py:no_such_task", "x")
    assert check_debug_nan(["run", "--report", "r.json", "--", "python", "train.py", "--lr", "1"], "x", "x") == 1
    assert check_script_command("scripts/bench_run.py", ["--warmup", "16", "--model", "deep"], "x", "x") == 2
    with pytest.raises(AssertionError, match="has no option -x"):
        check_shell_command("scripts/remote_debug.sh", ["-x", "host", "--", "--max-steps", "2"], "x", "x")
    with pytest.raises(AssertionError, match="has no option --max-step\\b"):
        check_shell_command("scripts/remote_debug.sh", ["-s", "-J", "host", "--", "--max-step", "2"], "x", "x")
    assert [args for args in debug_nan_commands("torchrun --nproc_per_node=2 $(which debug-nan) run -- t.py")] \
        == [["run", "--", "t.py"]]
