"""The run flags: one per declared setting (settings.py), in option groups, shared by the
engine's command line (`headroom-train`, engine/cli.py), the app's (app/main.py) and
`headroom-ctl start`, which checks a server run's flags before it starts anything
(engine/ctl/start.py). Torch-free, and Qt-free: argparse over the declarations.

Bad input is a ConfigError (one line, exit 2 for the callers), never argparse's usage block.
Defaults are left out of the namespace (SUPPRESS), so `given(ns)` is what was typed: --resume
and --fork put exactly those over the run's saved config (engine/run_config.py).
"""
from __future__ import annotations

import argparse
from typing import Any, Callable, NoReturn, Optional, Sequence, Union

from .config import ConfigError, TrainConfig, split_warmup
from .settings import GROUPS, OLD_WARMUP_FLAG, SETTINGS, Setting, read_float


class FlagParser(argparse.ArgumentParser):
    """An argparse parser whose bad input is a ConfigError: one line, no usage dump."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _arg_type(setting: Setting) -> Callable[[str], Any]:
    """The setting's reader as an argparse type: its one-line refusal becomes argparse's."""
    read = setting.reader

    def parse(text: str) -> Any:
        try:
            return read(text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = setting.name
    return parse


class _OldWarmup(argparse.Action):
    """--warmup W, the old spelling: below 1 it is --warmup-fraction W, 1 or more --warmup-samples W."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Union[str, Sequence[Any], None], option_string: Optional[str] = None) -> None:
        try:
            parts = split_warmup(read_float(str(values)), OLD_WARMUP_FLAG)
        except ConfigError as e:
            raise argparse.ArgumentError(self, str(e).removeprefix(OLD_WARMUP_FLAG + " ")) from None
        for name, value in parts.items():
            setattr(namespace, name, value)


def _add(group: Any, flag: str, setting: Setting, help_text: str) -> None:
    kw: dict[str, Any] = {"dest": setting.name, "default": argparse.SUPPRESS, "help": help_text.replace("%", "%%")}
    if setting.switch:
        kw["action"] = "store_true"
    else:
        if setting.choices:
            kw["choices"] = setting.choices
        else:
            kw["type"] = _arg_type(setting)
        if setting.repeat:
            kw["action"] = "append"
        if setting.metavar:
            kw["metavar"] = setting.metavar
    group.add_argument(flag, **kw)


def add_run_flags(p: argparse.ArgumentParser) -> dict[str, Any]:
    """The run flags shared by the engine's CLI and the app, one per declared setting
    (engine/declarations/settings.py), in option groups; returns the groups by name. Defaults
    are left out of the namespace (SUPPRESS) so that --resume can tell which flags were given;
    each help line names the TrainConfig default."""
    groups = {name: p.add_argument_group(name) for name in GROUPS}
    for s in SETTINGS:
        _add(groups[s.group], s.option, s, s.help_text())
    old = p.add_argument_group("Old spellings (still read)")
    for s in SETTINGS:
        for flag in s.old_flags:
            _add(old, flag, s, f"the old name of {s.option}")
    old.add_argument(OLD_WARMUP_FLAG, action=_OldWarmup, default=argparse.SUPPRESS, metavar="W",
                     help="the old warmup flag: below 1 it is --warmup-fraction W, 1 or more --warmup-samples W")
    return groups


def build_parser() -> argparse.ArgumentParser:
    """The engine's own command line (`headroom-train`, `python -m engine`): the run flags and --json."""
    p = FlagParser(prog="headroom-train", description="Headroom's headless trainer (exact gradient accumulation).")
    groups = add_run_flags(p)
    groups["Output"].add_argument("--json", action="store_true", help="print one JSON object per event on stdout")
    return p


def given(ns: argparse.Namespace) -> dict[str, Any]:
    """The run flags given on the command line, as TrainConfig fields (the defaults are not in ns)."""
    return {k: v for k, v in vars(ns).items() if k in TrainConfig.__dataclass_fields__}


__all__ = ["FlagParser", "add_run_flags", "build_parser", "given"]
