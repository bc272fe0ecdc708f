"""Every run setting, as TrainConfig declares it: what the user sets with a flag, in the app's
form, or (for the live ones) with a command while the run trains.

The one place a setting is declared is its TrainConfig field (engine/declarations/config.py,
`setting(...)` from _declare.py): name, type, default, flag, help, option group, the app's
label, live or not, a metrics column or not, range or words. Here those declarations become
`Setting`s (SETTINGS, in the field order: the live ones in the order a batch of changes is
applied), the live settings' values (`LiveSettings`, built from the live declarations) and the
lr scaling rule. From SETTINGS come the command-line flags (engine/cli.py), the app's form
fields and labels, and the commands (`set_<name>`, engine/declarations/commands.py); from the
per-step ones the metrics columns (events.StepMetrics). tests/engine/test_declarations.py
checks that every surface has every setting. Torch-free: the app imports this at start-up.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, make_dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Optional

from . import limits
from ._declare import GROUPS as GROUPS  # re-exported: cli.py, run_flags.py and the app read it here
from ._declare import LAUNCH_GROUP as LAUNCH_GROUP  # re-exported: the app's tests read it here
from ._declare import SETTING, Declared, default_of
from ._reading import read_float as read_float  # re-exported: run_flags.py reads it here
from ._reading import read_int, read_on_off, read_text
from .config import RANGES, TrainConfig, check_value, value_type
from .events import SettingsApplied

_READERS: dict[type, Callable[[str], Any]] = {int: read_int, float: read_float, bool: read_on_off, str: read_text}
_FIELDS = {f.name: f for f in fields(TrainConfig)}


# -- the declaration ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting(Declared):
    """A TrainConfig field's setting declaration (Declared), with the field's name and what its
    type, default and range say."""
    name: str = ""  # the TrainConfig field (and LiveSettings field, checkpoint key, metrics column, command field)

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def type(self) -> type:
        return value_type(self.name)

    @property
    def default(self) -> Any:
        return default_of(_FIELDS[self.name])

    @property
    def range(self) -> Optional[limits.Range]:
        return RANGES.get(self.name)

    @property
    def reader(self) -> Callable[[str], Any]:
        return self.read or _READERS.get(self.type, read_text)

    @property
    def words(self) -> str:
        """How a sentence names it."""
        return self.short or self.name.replace("_", " ")

    def default_text(self) -> str:
        """The default as the flag would be written ("" when there is nothing to say)."""
        v = self.default
        if self.switch or v in ({}, ()):
            return ""
        if v is None:
            return self.none_means
        if isinstance(v, bool):
            return "on" if v else "off"
        return f"{v:g}" if isinstance(v, float) else str(v)

    def help_text(self) -> str:
        shown = self.default_text()
        return f"{self.help} (default {shown})" if shown else self.help

    def check(self, value: Any, who: Optional[str] = None) -> Any:
        """The value if this setting may hold it, else ConfigError (one line)."""
        return check_value(self.name, value, who or self.option)


# Every field declared with setting(...), in TrainConfig's order.
SETTINGS: tuple[Setting, ...] = tuple(
    Setting(name=f.name, **{d.name: getattr(f.metadata[SETTING], d.name) for d in fields(Declared)})
    for f in fields(TrainConfig) if SETTING in f.metadata)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
# The live settings that say where a run ends: a change re-plans the lr schedule from where the
# run is (engine/declarations/schedule.py LrSchedule.replanned); one the run has passed is refused.
LENGTH_NAMES = ("epochs", "max_steps")
# The live settings, in the order a batch of changes is applied (micro-batch and accumulation
# before lr, so lr scaling sees the new batch; the run's length last, planned with the new batch).
LIVE_SETTINGS: tuple[Setting, ...] = (tuple(s for s in SETTINGS if s.live and s.name not in LENGTH_NAMES)
                                      + tuple(s for s in SETTINGS if s.live and s.name in LENGTH_NAMES))
LIVE_NAMES: tuple[str, ...] = tuple(s.name for s in LIVE_SETTINGS)
# The flag's old spellings: --warmup W is one of two settings by its value (config.split_warmup).
OLD_WARMUP_FLAG = "--warmup"


# -- the live settings' values ----------------------------------------------------------------
class _LiveSettingsMethods:
    """What LiveSettings does; its fields are the live declarations (below)."""
    micro_batch: int
    accum: int

    @property
    def window_samples(self) -> int:  # per rank, for fixed windows
        return self.micro_batch * self.accum

    def with_(self, **changes: Any) -> LiveSettings:
        return replace(self._dataclass(), **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self._dataclass())

    @classmethod
    def from_config(cls, config: Any) -> LiveSettings:
        return LiveSettings(**{name: getattr(config, name) for name in LIVE_NAMES})

    def updated(self, saved: Optional[dict[str, Any]]) -> LiveSettings:
        """These settings with the values a checkpoint saved (unknown keys ignored)."""
        known = {f.name for f in fields(self._dataclass())}
        return replace(self._dataclass(), **{k: v for k, v in (saved or {}).items() if k in known})

    def _dataclass(self) -> LiveSettings:
        assert isinstance(self, LiveSettings)  # the methods of LiveSettings, a dataclass (below)
        return self


if TYPE_CHECKING:
    @dataclass(frozen=True, init=False)
    class LiveSettings(_LiveSettingsMethods):
        """What a type checker sees of LiveSettings: its fields are made from the declarations."""
        def __init__(self, **values: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...
else:
    # Frozen: a change makes a new object, so the settings a window was trained with can never
    # change under it. Fields: the live settings in order, typed and defaulted as TrainConfig's.
    LiveSettings = make_dataclass(
        "LiveSettings", [(s.name, s.type, field(default=s.default)) for s in LIVE_SETTINGS],
        bases=(_LiveSettingsMethods,), frozen=True,
        namespace={"__doc__": "The values of the live settings (engine/declarations/settings.py LIVE_SETTINGS)."})
    LiveSettings.__module__ = __name__


# -- the lr scaling rule ------------------------------------------------------------------------
def scale_lr(lr: float, rule: str, ratio: float) -> float:
    """The lr for an effective batch `ratio` times the one `lr` was set for: linear (x ratio),
    sqrt (x sqrt(ratio)) or none (unchanged). The one place the rule is written: a batch
    change mid-run (engine/declarations/rules.py) and --reference-batch at the start both use it."""
    if rule == "linear":
        return lr * ratio
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    return lr


def scaled_to_reference(settings: Any, config: Any, world: int, emit: Any, step: int) -> Any:
    """--reference-batch B with --lr-scaling linear|sqrt: the given lr was tuned for an
    effective batch of B; scale it to this run's (micro-batch x accum x world, after the
    finder chose them). Says so with a settings_applied event."""
    ref = getattr(config, "reference_batch", None)
    if not ref or settings.lr_scaling == "none":
        return settings
    lr = scale_lr(settings.lr, settings.lr_scaling, settings.window_samples * world / ref)
    if lr == settings.lr:
        return settings
    emit(SettingsApplied(step, 1, changes=(("lr", settings.lr, lr),), at="start", from_step=step + 1,
                         by_rule=("lr",)))
    return settings.with_(lr=lr)
