"""`debug-nan run -- PROGRAM`: a command that is not Python run in this process (torchrun, `accelerate launch`, a
shell or SLURM script, srun), watched in every Python process beneath it that trains, with ONE answer.

The program runs as a child, as it would alone (its own stdin, stdout, stderr and working directory), with the
run's private folder (app/run_folder.py) first on its PYTHONPATH: every Python process it starts loads the
start-up hook, which stays inert until that process creates an optimizer (process/startup_hook.py), and a process
that trains is watched as a rank under `torchrun -m debug_nan run` is (app/run_hook.py). Ctrl-C reaches the
program from the terminal as without debug-nan; a SIGTERM or SIGHUP sent to debug-nan is passed on to every
process of the command (as SLURM and `timeout` signal a whole job: a shell script's python gets it, not the shell
alone). When it has ended, the watched processes' results make one answer through the one output pipeline
(presentation/pipeline.py): the history table, --plot and --tensorboard of the rank that made the value (rank 0's when
clean), one summary (the last block on screen, after any launcher traceback) and one report: the rank that made the
first non-finite value, the ranks that saw it, each rank's own origin, and the exit code (1 for a finding, else the
program's own). A command that runs one node's ranks (`srun debug-nan run -- torchrun --nnodes N ...`) answers for
them: a rank on another node is not one that left, and its outputs go beside global rank 0's node's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from debug_nan.app import command as commands
from debug_nan.app import run_paths as paths
from debug_nan.app.run_folder import REFUSED, RunFolder
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.session.result import RunResult
from debug_nan.engine.watch.history import History
from debug_nan.errors import CommandRaised, InputError
from debug_nan.presentation.history_plot import check_plot_available
from debug_nan.presentation.history_rows import Layout
from debug_nan.presentation.log import Log, error_line
from debug_nan.presentation.outputs import rank_path
from debug_nan.presentation.pipeline import OutputOptions, present
from debug_nan.presentation.tensorboard import check_tensorboard

FORWARDED = (signal.SIGTERM, signal.SIGHUP)  # to every process of the command (Ctrl-C: from the terminal)


def run_program(command: commands.Command, options) -> int:
    """Run the program with the hook, wait for its end -> the exit code of the one answer."""
    check_plot_available(options.plot)  # (before anything runs: the answer's outputs are this process's)
    check_tensorboard(options.tensorboard)
    # (streamed beside --log under a name of this process's: each node's debug-nan may share one file system)
    log = Log(paths.partial(f"{options.log}.{os.getpid()}") if options.log else None, follow_stderr=True)
    log(f"[debug-nan] run: {command.describe()} (a program: every Python process it starts is watched from its "
        f"first optimizer; debug-nan's lines on stderr, one summary when the program has ended)")
    started = time.perf_counter()
    folder, results = RunFolder().make(), []
    try:
        try:
            code, signalled = _run_child(command, folder.environment(options))
            results, launched = folder.results(), folder.launcher_failures()
        finally:
            folder.remove()
        return answer(results, code, signalled, command, options, log, time.perf_counter() - started, launched)
    finally:  # (also when the program could not start: no hidden copy left behind)
        _place_log(log, options, _ranks_here(results, max((r.get("world") or 1 for r in results), default=1)))


def _run_child(command: commands.Command, env: dict) -> tuple[int, str | None]:
    """-> (the program's exit code, as a shell gives it: 128 + N for a signal; the signal passed on to it)."""
    try:
        child = subprocess.Popen(command.argv, executable=command.target, env=env)
    except FileNotFoundError:
        raise InputError(f"debug-nan run -- {command.describe()}: {command.argv[0]}: command not found (not a "
                         f"file, nor a program on PATH).") from None
    except PermissionError:
        raise InputError(f"debug-nan run -- {command.describe()}: {command.argv[0]} is not executable (chmod +x "
                         f"it, or run it through its interpreter: bash {command.argv[0]} ...).") from None
    except OSError as exc:
        raise InputError(f"debug-nan run -- {command.describe()}: {command.argv[0]} cannot be run "
                         f"({exc.strerror or exc}).") from None
    passed: list[str] = []
    signalled: set[int] = set()

    def pass_on(signum, frame):  # (the signal module's signature)
        passed.append(signal.Signals(signum).name)
        for pid in _process_tree(child.pid):  # every process of the command, as SLURM and `timeout` signal a job
            try:
                os.kill(pid, signum)
                signalled.add(pid)
            except OSError:  # (it has ended meanwhile)
                pass

    saved = {s: signal.signal(s, pass_on) for s in FORWARDED}
    saved[signal.SIGINT] = signal.signal(signal.SIGINT, lambda *_: passed.append("SIGINT"))  # (the child has it)
    try:
        code = child.wait()
        _wait_for(signalled - {child.pid})  # (a shell's python, leaving its result, may outlive the shell)
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    return (128 - code if code < 0 else code), (passed[0] if passed else None)


def _wait_for(pids: set[int], timeout_s: float = 30.0) -> None:
    """Until the processes a signal was passed on to have ended (they are not this process's children: polled)."""
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        pids = {pid for pid in pids if _alive(pid)}
        if pids:
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # (a zombie has ended)
    except (OSError, IndexError):
        return False


def _process_tree(pid: int) -> list[int]:
    """The program's process and every process beneath it, from each process's parent in /proc/PID/stat (Linux;
    elsewhere the program's process alone)."""
    parents: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return [pid]
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])  # (the name may hold spaces and parens)
        except (OSError, ValueError, IndexError):  # (it has ended)
            continue
        parents.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        here = todo.pop()
        found.append(here)
        todo += parents.get(here, [])
    return found


def answer(results: list[dict], code: int, signalled: str | None, command: commands.Command, options, log: Log,
           elapsed: float, launched: dict[int, int] | None = None) -> int:
    """The watched processes' results and the program's exit code (and `launched`: the launcher's exit code of each
    worker that failed, by rank) -> the one summary and report; the exit code."""
    if not results:
        if signalled is not None:
            log(f"[debug-nan] interrupted ({signalled}) before any process trained.")
            return code
        if code != 0:  # its own failure, before anything trained: its code, as without debug-nan
            failed = CommandRaised(f"the command failed (exit {code}) before any process it started trained: its "
                                   f"own error is above.")
            failed.exit_code = code
            raise failed
        raise InputError(f"the command ended (exit {code}) without training: no Python process it started created a "
                         f"torch.optim optimizer and trained a model with it (debug-nan run watches each process "
                         f"from its first optimizer: a process of another Python environment than {sys.executable} "
                         f"is not reached).")
    world = max(r.get("world") or 1 for r in results)
    ours = _ranks_here(results, world)
    for r in results:  # a rank that ended alone: what it saw, marked with its rank
        if r.get("held") and r.get("rank") and r["report"].get("status") == "error":
            for line in r["held"].splitlines():
                log(f"[rank {r['rank']}] {line}")
    found = [r for r in results if r["report"].get("first_nonfinite")]
    chosen = min(found, key=_first) if found else next(
        (r for r in results if r["report"].get("status") == "error"), results[0])
    data = dict(chosen["report"])
    refused = [r["code"] for r in results if r.get("ending") == REFUSED]  # (a forked child that trained)
    final = 1 if found else refused[0] if refused else code
    first = data.get("first_nonfinite")
    if first is not None and world > 1:
        _name_ranks(first, chosen, found)
    notes = list(data.get("notes") or [])
    left = [] if found else _left_early(results, ours, code, launched or {})
    if left:  # no finding: the rank that left while the others trained is what ended the run
        data["status"] = "error"
        data["error"] = " ".join(left) + (f" Then: {data['error']}" if data.get("error") else "")
    data.update(status="nonfinite" if found else data.get("status", "clean"), exit_code=final, notes=notes,
                ranks=[_rank_entry(r) for r in results], interrupted=signalled is not None,
                settings=options.report_settings())
    data["integration"] = {**(data.get("integration") or {}), "framework": "debug-nan run", "kind": "program",
                           "command": options.command, "world_size": world, "exit_code_of_command": code,
                           "processes_watched": len(results)}
    findings = [Finding(**f) for f in data.get("findings") or []]
    if first is not None:
        findings[:1] = [Finding(**first)]
    layout = chosen.get("layout")  # the history of the rank of the finding (rank 0's when clean), as its model reads
    result = RunResult(status=data["status"], steps_run=data.get("steps_run", 0), finding=findings[0] if findings
                       else None, findings=findings, error=data.get("error"), notes=notes,
                       history=History.from_dict(data.get("history") or []) if layout else History(),
                       interrupted=signalled is not None, exit_code=final)
    outputs = OutputOptions(*(_this_node(paths.destination(path, option, None, log), ours)
                              for path, option in ((options.report, "--report"), (options.plot, "--plot"))),
                            options.tensorboard, options.history)
    presented = present(log, result, Layout(layout or []), outputs, settings=None, device=None, elapsed=elapsed,
                        interrupted_by=signalled or "Ctrl-C",
                        report_of=lambda result, code: {**data, "exit_code": code, "notes": list(result.notes)})
    if not presented.ok:  # (a full disk): exit 2, as every entry point's unwritable output
        log(error_line(presented.why), "red")
        return 2
    return final


def _ranks_here(results: list[dict], world: int) -> list[int]:
    """The global ranks this command runs: its torchrun node's (each rank says its node's, from RANK, LOCAL_RANK and
    LOCAL_WORLD_SIZE: under `srun debug-nan run -- torchrun --nnodes N ...` each node's command has its own), else
    every rank of the world."""
    spans = [r.get("node_ranks") for r in results]
    if world > 1 and spans and all(spans):
        return sorted({rank for span in spans for rank in span})
    return list(range(world))


def _this_node(path: str | None, ours: list[int]) -> str | None:
    """An output of a command that does not run global rank 0 (another node's): beside rank 0's node's, as another
    rank's own copy is (report.rank1.json), never over it."""
    return rank_path(path, ours[0]) if path and ours and 0 not in ours else path


def _first(result: dict) -> tuple:
    """The order of findings: the earliest step first, then the rank the ranks agreed on, then the lowest rank."""
    f = result["report"]["first_nonfinite"]
    own = f.get("rank") if f.get("rank") is not None else result.get("rank")
    return f["step"], f.get("phase") == "eval", own != result.get("rank"), result.get("rank") or 0


def _name_ranks(first: dict, chosen: dict, found: list[dict]) -> None:
    """Several ranks: the finding names its rank, the ranks that saw it and each rank's own origin."""
    if first.get("rank") is None:
        first["rank"] = chosen.get("rank")
    if not first.get("first_ranks"):
        first["first_ranks"] = sorted({r["rank"] for r in found if r.get("rank") is not None
                                       and r["report"]["first_nonfinite"]["step"] == first["step"]})
    origins = dict(first.get("rank_origins") or {})
    for r in found:
        f = r["report"]["first_nonfinite"]
        if f.get("rank") not in (None, r.get("rank")):  # (the ranks' agreed finding, made by another rank)
            continue
        origins.setdefault(str(r["rank"]), f"{f.get('op') or f.get('cause')} at {f.get('source') or f['phase']} "
                                           f"(step {f['step']}, phase {f['phase']})")
    first["rank_origins"] = origins or None


def _left_early(results: list[dict], ours: list[int], code: int, launched: dict[int, int]) -> list[str]:
    """The ranks that left while the others trained (an exit, a kill), each named with how it ended (a rank of this
    command that left no result: as its launcher saw it end, where it said)."""
    if len(ours) < 2 and max(r.get("world") or 1 for r in results) < 2:
        return []
    steps = max(r["report"].get("steps_run", 0) for r in results)
    seen = {r.get("rank") for r in results}
    said = [_without_result(r, launched.get(r), code) for r in ours if r not in seen]
    # (a rank the launcher stopped by SIGTERM, once another left, leaves its result as interrupted: not a leaver)
    others_failed = any(r.get("ending") == "error" or r["report"].get("interrupted") for r in results)
    for r in results:
        ran = r["report"].get("steps_run", 0)
        if r["report"].get("interrupted"):
            continue
        # how it exited: as its launcher saw it (a SystemExit it raised itself, os._exit), else as it said
        exited = launched.get(r.get("rank"), r.get("code"))
        if r.get("ending") == "ended" and (ran < steps or others_failed and exited):
            said.append(f"Rank {r['rank']} left the run after {ran} step(s) while the others trained: "
                        f"{_how(exited, r.get('code_seen', True) or r.get('rank') in launched)}.")
    return said


def _how(exited: int, seen: bool) -> str:
    if exited < 0:
        return f"it was killed by {_signal_name(-exited)}"
    if seen:
        return f"it exited with code {exited}"
    return ("its script ended there (it returned, or raised SystemExit itself, whose code a process cannot read: "
            "its launcher did not say)")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _without_result(rank: int, exitcode: int | None, code: int) -> str:
    if exitcode is not None and exitcode < 0:
        return (f"Rank {rank} was killed by {_signal_name(-exitcode)} while the others trained (its launcher saw "
                f"exit code {exitcode}; the command's exit: {code}).")
    if exitcode is not None:
        return (f"Rank {rank} exited with code {exitcode} while the others trained, without a result (the "
                f"command's exit: {code}).")
    return (f"Rank {rank} ended without a result while the others trained: it was killed or crashed (the command's "
            f"exit: {code}).")


def _rank_entry(result: dict) -> dict:
    report, first = result["report"], result["report"].get("first_nonfinite")
    return {"rank": result.get("rank"), "pid": result.get("pid"), "ending": result.get("ending"),
            "status": report.get("status"), "steps_run": report.get("steps_run"), "error": report.get("error"),
            "origin": None if first is None else {k: first.get(k) for k in ("step", "micro_step", "phase", "op",
                                                                           "source", "module")}}


def _place_log(log: Log, options, ours: list[int]) -> None:
    """The --log copy to its place: --log, or beside it for a command that runs no global rank 0 (another node's)."""
    if log.copy_path is None:
        return
    log.close()
    notes: list[str] = []
    paths.place(log.copy_path, _this_node(options.log, ours), "--log", None, notes.append)
    for line in notes:
        log(line, "yellow")
