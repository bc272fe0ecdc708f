"""`headroom-ctl` (also `python -m engine.ctl`): see a run's state, steer it and follow it, on this
machine or on another through ssh.

    headroom-ctl status RUN [--json]
    headroom-ctl set RUN KEY=VALUE... [--at step|epoch] [--wait [--timeout S]]
    headroom-ctl pause|unpause|stop RUN [--wait [--timeout S]]
    headroom-ctl follow RUN [--from-step N [--after-event ID]] [--json]
    headroom-ctl runs [DIR | HOST:[DIR]]
    headroom-ctl start [DIR | HOST:[DIR]] [--detach auto|tmux|setsid] -- ENGINE_FLAGS...
    headroom-ctl tag RUN [TAG...] [--remove TAG...] [--clear]
    headroom-ctl note RUN [TEXT... | --clear]
    headroom-ctl archive|unarchive RUN
    headroom-ctl mcp

RUN is a run folder or `[user@]host:path` (engine/ctl/remote.py). Built on the client API
(engine/ctl/client), as the app is. Exit codes: 0 done, 2 bad
input (one `error: ...` line, nothing sent), 3 a change refused (set --wait), 4 no live run (or
it ended before it answered), 5 the remote could not be reached, spoke another protocol, or the
connection broke. Torch-free: this is what a laptop without a GPU runs.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Iterator, NoReturn, Optional

from engine.declarations import limits

from . import client
from .local import SETTABLE
from .output import ClientGone, Output, printable
from .protocol import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_NOT_LIVE,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_REMOTE,
    PROTOCOL,
    CtlError,
    error,
)
from .remote import PYTHON_ENV, SSH_ENV, default_python

EPILOG = (f"RUN is a run folder, or [user@]host:path on a machine reached with ssh (set {SSH_ENV} to change "
          "the ssh command, e.g. 'ssh -F ~/work/ssh_config'). Exit codes: 0 done, 2 bad input, 3 a change "
          "refused (set --wait), 4 no live run, 5 the remote could not be reached or speaks another protocol.")


ERROR_CHARS = 2000  # the longest `error:` line (a server's message is cut in the middle)


class _Parser(argparse.ArgumentParser):
    """Bad input is one line and exit 2, never argparse's usage block."""

    def error(self, message: str) -> NoReturn:
        raise CtlError(f"{self.prog.split()[-1]}: {message}" if " " in self.prog else message)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text[:40]!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text[:40]!r}")
    return value


def parser() -> argparse.ArgumentParser:
    # allow_abbrev off, here and in each command: a flag is taken only as spelt in full
    p = _Parser(prog="headroom-ctl", description="See, steer and follow Headroom runs, here or on a server over ssh.",
                epilog=EPILOG, allow_abbrev=False)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def command(name: str, help: str, run: bool = True) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help, description=help, epilog=EPILOG, allow_abbrev=False)
        if run:
            c.add_argument("run", metavar="RUN", help="a run folder, or [user@]host:path")
        c.add_argument("--json", action="store_true", help="one JSON record per line (the protocol in README)")
        c.add_argument("--remote-python", default=default_python(), metavar="CMD",
                       help=f"the python with Headroom on the remote machine (default ${PYTHON_ENV}, else python3)")
        c.add_argument("--protocol", type=int, default=None, help=argparse.SUPPRESS)  # set by a client program
        return c

    command("status", "the run's state: live or not, step, epoch, settings, last loss, ETA")
    s = command("set", "change live settings of a running run (the same validated commands the app sends)")
    s.add_argument("changes", nargs="+", metavar="KEY=VALUE", help=f"settings: {', '.join(SETTABLE)}")
    s.add_argument("--at", choices=("step", "epoch"), default="epoch",
                   help="apply at the next optimizer step or the next epoch (default epoch)")
    for name, help in (("pause", "pause at the next epoch boundary"), ("unpause", "go on after a pause"),
                       ("stop", "stop at the next micro-batch, writing a checkpoint")):
        command(name, help)
    for c in (s, *(sub.choices[n] for n in ("pause", "unpause", "stop"))):
        c.add_argument("--wait", action="store_true",
                       help="wait for the engine's answer (exit 0 applied, 3 refused, 4 no live run)")
        c.add_argument("--timeout", type=_seconds, default=None, metavar="S", help="give up waiting after S seconds")
        # Which client sends the command (client.SteerRequest.client): the run's rows record it.
        c.add_argument("--sent-by", default="", help=argparse.SUPPRESS)
    f = command("follow", "stream every metrics row and event as the run commits them, until it ends")
    f.add_argument("--from-step", type=_non_negative, default=0, metavar="N", help="start at step N (default 0)")
    f.add_argument("--after-event", type=_non_negative, default=None, metavar="ID",
                   help="with --from-step: events after this id (to resume a broken stream exactly)")
    r = command("runs", "the runs under a runs folder, with their state", run=False)
    r.add_argument("where", nargs="?", default="", metavar="DIR|HOST:[DIR]",
                   help="a runs folder, here or on a host (default: the runs root, $HEADROOM_RUNS)")
    st = command("start", "start `python -m engine ENGINE_FLAGS` detached (in tmux when there is one), here or on "
                          "a host, and return once it holds its run folder", run=False)
    st.add_argument("where", nargs="?", default="", metavar="DIR|HOST:[DIR]",
                    help="the run folder, here or on a host (default: a new one under that machine's runs root)")
    st.add_argument("--detach", choices=client.DETACH, default="auto",
                    help="how the run is kept going when the terminal or the ssh connection ends: inside tmux, or "
                         "in a session of its own with its output in the run folder's console.log (default: tmux "
                         "when installed)")
    st.add_argument("--timeout", type=_seconds, default=None, metavar="S",
                    help=f"wait at most S seconds for the engine to take its folder (default {client.START_WAIT_S:g})")
    st.set_defaults(engine_flags=[])
    _label_commands(command)
    sub.add_parser("mcp", help="serve the Model Context Protocol over stdio, for agents (the mcp extra)",
                   description="serve the Model Context Protocol over stdio: tools that list, read and steer runs "
                               "(README: headroom-ctl mcp)", allow_abbrev=False)
    return p


def _label_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """tag, note, archive, unarchive: the run's labels (engine/store/labels.py), in its folder."""
    t = command("tag", "add tags to the run (--remove: take them off); with neither, print its tags")
    t.add_argument("tags", nargs="*", metavar="TAG", help="a tag: a word or a few (quote one with spaces)")
    t.add_argument("--remove", nargs="+", action="extend", default=[], metavar="TAG", help="tags to take off")
    t.add_argument("--clear", action="store_true", help="take off every tag first (with TAGs: the tags are these)")
    # A client's whole change in one command (client.label): each tag and the note after `=` (one
    # may begin with '-'), archived too.
    t.add_argument("--add", action="append", default=[], help=argparse.SUPPRESS)
    t.add_argument("--note", default=None, help=argparse.SUPPRESS)
    t.add_argument("--archive", dest="archived", action="store_const", const=True, default=None,
                   help=argparse.SUPPRESS)
    t.add_argument("--unarchive", dest="archived", action="store_const", const=False, help=argparse.SUPPRESS)
    n = command("note", "set the run's note (--clear: empty it); without TEXT, print it")
    n.add_argument("text", nargs="*", metavar="TEXT", help="the note (its words are joined with spaces)")
    n.add_argument("--clear", action="store_true", help="empty the note")
    command("archive", "archive the run: the run list leaves it out until shown again")
    command("unarchive", "bring an archived run back into the run list")


def split_engine_flags(argv: list[str]) -> tuple[list[str], Optional[list[str]]]:
    """`start ... -- ENGINE_FLAGS`: headroom-ctl's words, and the engine's after the first `--`."""
    if argv[:1] != ["start"] or "--" not in argv:
        return argv, None
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def _records(args: argparse.Namespace, out: Output) -> Iterator[client.AnyRecord]:
    """The command's records, through the client API (here, or through engine.ctl on a host)."""
    python = args.remote_python
    if args.command == "start":
        yield from client.start(args.engine_flags, args.where, detach=args.detach, wait_s=args.timeout,
                                remote_python=python)
    elif args.command == "runs":
        yield from client.runs(args.where, remote_python=python)
    elif args.command == "status":
        yield from client.status(args.run, remote_python=python)
    elif args.command in client.ACTIONS:
        request = client.SteerRequest(args.command, tuple(getattr(args, "changes", ())), getattr(args, "at", "epoch"),
                                      client=args.sent_by)
        yield from client.steer(args.run, request, wait=args.wait, timeout=args.timeout, remote_python=python)
    elif args.command in LABEL_PART:
        yield from _label(args)
    elif args.command == "follow":
        # A client program (--protocol) runs this over ssh: end when the session that started it goes.
        yield from client.Following(args.run, args.from_step, args.after_event, remote_python=python,
                                    watch_parent=args.protocol is not None, idle=out.flush).records()


# What a label command prints for a person: the part of the labels it is about.
LABEL_PART = {"tag": "tags", "note": "note", "archive": "archived", "unarchive": "archived"}


def _label(args: argparse.Namespace) -> Iterator[client.AnyRecord]:
    """A tag, note, archive or unarchive command, through client.label."""
    python = args.remote_python
    if args.command == "tag":
        return client.label(args.run, add=args.tags + args.add, remove=args.remove, tags=[] if args.clear else None,
                            note=args.note, archived=args.archived, remote_python=python)
    if args.command == "note":
        if args.clear and args.text:
            raise CtlError("note: give TEXT or --clear, not both")
        note = "" if args.clear else " ".join(args.text) if args.text else None
        return client.label(args.run, note=note, remote_python=python)
    return client.label(args.run, archived=args.command == "archive", remote_python=python)


def _more_words(args: argparse.Namespace, unknown: list[str]) -> list[str]:
    """tag and note: the words argparse leaves after an option (`tag RUN --clear a b`) are more
    TAGs or TEXT, as are all after `--`; what is still unknown is returned."""
    if args.command not in ("tag", "note"):
        return unknown
    cut = unknown.index("--") if "--" in unknown else len(unknown)
    words = [w for w in unknown[:cut] if not w.startswith("-")] + unknown[cut + 1:]
    (args.tags if args.command == "tag" else args.text).extend(words)
    return [w for w in unknown[:cut] if w.startswith("-")]


def _run(args: argparse.Namespace, out: Output) -> int:
    if args.protocol is not None and args.protocol != PROTOCOL:
        raise CtlError(f"this engine speaks headroom-ctl protocol {PROTOCOL}, the client asked for {args.protocol}: "
                       "install the same Headroom version on both machines", EXIT_REMOTE)
    answers: dict[Optional[int], str] = {}
    last_step, last_event = -1, None  # the last step and event id written: where a broken follow goes on
    try:
        for record in _records(args, out):
            if isinstance(record, client.CommandAnswer):
                answers[record.id] = record.status
            elif isinstance(record, client.Rows) and record.last_step is not None:
                last_step = record.last_step
            elif isinstance(record, client.Event) and record.id is not None:
                last_event = record.id
            elif isinstance(record, client.Rewind):
                last_step = record.to_step
            out.write(record.raw, LABEL_PART.get(args.command, ""))
    except CtlError as e:
        if args.command == "follow" and e.code == EXIT_REMOTE and client.is_remote(args.run):
            step = max(last_step + 1, args.from_step)
            event = last_event if last_event is not None else args.after_event
            again = f"--from-step {step}" + (f" --after-event {event}" if event is not None else "")
            raise CtlError(f"{e}; to go on where it broke: follow {again}", e.code) from None
        raise
    out.flush()
    if not getattr(args, "wait", False):
        return EXIT_OK
    if any(s == "refused" for s in answers.values()):
        return EXIT_REFUSED
    if any(s == "expired" for s in answers.values()):
        return EXIT_NOT_LIVE
    return EXIT_OK


def main(argv: Optional[list[str]] = None) -> int:
    argv, engine_flags = split_engine_flags(list(sys.argv[1:] if argv is None else argv))
    out = Output(sys.stdout, as_json="--json" in argv)
    try:
        out.hello()  # first, always: a client checks it before anything else
        args, unknown = parser().parse_known_args(argv)
        unknown = _more_words(args, unknown)
        if unknown:
            hint = " (start: the engine's flags go after --)" if args.command == "start" else ""
            raise CtlError(f"unrecognized arguments: {' '.join(unknown)}{hint}")
        if engine_flags is not None:
            args.engine_flags = engine_flags
        if args.command == "mcp":
            from . import agent  # the MCP SDK only for this command
            agent.serve()
            return EXIT_OK
        return _run(args, out)
    except CtlError as e:
        return _fail(out, str(e), e.code)
    except ClientGone:
        out.silence()
        return EXIT_REMOTE
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug: still one line, and the kind of failure, for a report
        return _fail(out, f"{type(e).__name__}: {e}", EXIT_FAILED)


def _fail(out: Output, message: str, code: int) -> int:
    message = limits.one_line(message, ERROR_CHARS)  # one line, however long what a server said
    if out.as_json:
        try:
            out.write(error(message, code))
            out.flush()
        except ClientGone:
            out.silence()
    print(f"error: {printable(message)}", file=sys.stderr)  # a server's or run folder's words: no escapes
    return code


__all__ = ["main", "parser", "EXIT_BAD_INPUT"]
