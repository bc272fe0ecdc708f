"""Changes to a run's live settings on their way to the engine, per setting: what was sent,
what the engine said it will do with it, and what became of it, with the text the UI shows.

The engine decides when a change applies (at the next epoch boundary, or the next step) and
says so in a command_received event; this model only records what it says, it never works
a boundary out itself. Qt-free: fed by the session, read by the controls panel.

    sent ──command_received──> received ──settings_applied──> applied
      │                           │    └──command_refused───> refused
      └───────────────────────────┴──the run ended first───> dropped
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Callable, Iterable, Optional

from engine.declarations.commands import payload_value, setting_of
from engine.declarations.settings import LIVE_NAMES

from .fields import fmt_value, same


class ChangeStatus(str, Enum):
    SENT = "sent"  # handed to the run; the engine has not yet said it took it in
    RECEIVED = "received"  # the engine took it in and said when it applies
    APPLIED = "applied"
    UNCHANGED = "unchanged"  # its boundary passed and nothing changed: the engine had that value
    REFUSED = "refused"
    DROPPED = "dropped"  # the run ended before it applied


PENDING = (ChangeStatus.SENT, ChangeStatus.RECEIVED)
# The label's "state" property, which the stylesheets colour: amber, green, red.
STYLE = {ChangeStatus.SENT: "pending", ChangeStatus.RECEIVED: "pending", ChangeStatus.APPLIED: "applied",
         ChangeStatus.UNCHANGED: "applied", ChangeStatus.REFUSED: "refused", ChangeStatus.DROPPED: "refused"}
WHEN = {"epoch": "at epoch {epoch}", "step": "at the next step", "now": "now"}


@dataclass(frozen=True)
class SettingChange:
    name: str
    value: Any  # the value sent; for a change nobody here sent, the value the engine applied
    status: ChangeStatus
    sent_epoch: int = 0  # the epoch being trained when it was sent
    applies: Optional[str] = None  # the engine's word: "epoch", "step" or "now"
    target_epoch: Optional[int] = None  # with applies == "epoch": the first epoch with the new value
    while_paused: bool = False  # the engine took it in while the run was paused
    step: Optional[int] = None  # applied after this step...
    epoch: Optional[int] = None  # ...for epoch `epoch` on
    reason: str = ""  # why it was refused
    by_rule: bool = False  # the engine's lr scaling rule changed it, nobody sent it
    elsewhere: bool = False  # another client sent it (headroom-ctl, another window): the run's events say so
    sent_by: str = ""  # the sender its command row names ("agent": headroom-ctl mcp), when it says one

    @property
    def who(self) -> str:
        """' (sent by an agent)', ' (sent by another client)', or '' for this window's own change."""
        if not self.elsewhere:
            return ""
        return " (sent by an agent)" if self.sent_by == "agent" else " (sent by another client)"

    @property
    def pending(self) -> bool:
        return self.status in PENDING

    @property
    def style(self) -> str:
        return STYLE[self.status]

    @property
    def text(self) -> str:
        v = fmt_value(self.value)
        s = self.status
        if s is ChangeStatus.SENT:
            return f"pending: {v} (sent)"
        if s is ChangeStatus.RECEIVED:
            when = WHEN.get(self.applies or "", str(self.applies)).format(epoch=self.target_epoch)
            paused = " (now: the run is paused)" if self.while_paused and self.applies == "epoch" else ""
            return f"pending: {v} applies {when}{paused}{self.who}"
        if s is ChangeStatus.APPLIED:
            how = " (by the lr scaling rule)" if self.by_rule else self.who
            return f"applied: {v} from epoch {self.epoch}, after step {self.step}{how}"
        if s is ChangeStatus.UNCHANGED:
            return f"unchanged: {v}"
        if s is ChangeStatus.REFUSED:
            return f"refused: {self.reason}"
        return f"not applied: the run ended first ({v})"

    def boundary_reached(self, epoch: int) -> bool:
        """Steps of `epoch` arrived: the boundary the engine named (or, before it named one,
        any boundary after the change was sent) is behind the run."""
        if self.target_epoch is not None:
            return epoch >= self.target_epoch
        return epoch > self.sent_epoch


class PendingChanges:
    """The engine's current live settings, and the latest change of each, by field name.

    Every method that takes news returns the names whose entry changed, for the views.
    """

    def __init__(self) -> None:
        self.engine: dict[str, Any] = {}  # what the engine has now, as far as it has said
        self.changes: dict[str, SettingChange] = {}

    # -- reading -------------------------------------------------------------------------
    def get(self, name: str) -> Optional[SettingChange]:
        return self.changes.get(name)

    def text(self, name: str) -> str:
        c = self.changes.get(name)
        return c.text if c is not None else ""

    def is_pending(self, name: str) -> bool:
        c = self.changes.get(name)
        return c is not None and c.pending

    def edits(self, form: dict[str, Any]) -> dict[str, Any]:
        """Form values worth sending: different from the engine's, and not already on their way.
        A value back to the engine's while another is pending is sent too (it cancels that one)."""
        out: dict[str, Any] = {}
        for name in LIVE_NAMES:
            v = form.get(name)
            if v is None or name not in self.engine:
                continue
            c = self.changes.get(name)
            on_the_way = c is not None and c.pending
            if on_the_way and c is not None and same(c.value, v):
                continue
            if on_the_way or not same(self.engine[name], v):
                out[name] = v
        return out

    # -- news ----------------------------------------------------------------------------
    def clear(self) -> list[str]:
        """A new run: nothing known, nothing on its way."""
        names = list(self.changes)
        self.engine, self.changes = {}, {}
        return names

    def set_engine(self, values: dict[str, Any]) -> dict[str, Any]:
        """What the engine has (run_started's config, a step's row, an OOM recovery). Returns
        the values that are news: those it did not have already (the form follows only those,
        so a value it shows is not put back on every frame)."""
        taken = {n: v for n, v in values.items() if n in LIVE_NAMES and v is not None
                 and not (n in self.engine and same(self.engine[n], v))}
        self.engine.update(taken)
        return taken

    def sent(self, name: str, value: Any, epoch: int) -> list[str]:
        self.changes[name] = SettingChange(name, value, ChangeStatus.SENT, sent_epoch=epoch)
        return [name]

    def received(self, command: str, payload: dict[str, Any], applies: str, target_epoch: Optional[int],
                 paused: bool) -> list[str]:
        """The engine's command_received. The receipt of this window's change moves it on; an
        older one's (a newer value was sent since) changes nothing. A change another client sent
        (headroom-ctl, another window) is shown as the run's own events say it, unless a change of
        this window's is on its way for that setting."""
        f = setting_of(command)
        if f is None or f.name not in LIVE_NAMES:
            return []
        value = payload_value(command, payload)
        c = self.changes.get(f.name)
        if c is not None and c.status is ChangeStatus.SENT:
            if not same(c.value, value):
                return []
            self.changes[f.name] = replace(c, status=ChangeStatus.RECEIVED, applies=applies,
                                           target_epoch=target_epoch, while_paused=paused)
        elif c is not None and c.pending:  # this window's, already received: a newer receipt is not its
            return []
        else:
            sender = payload.get("sent_by")
            self.changes[f.name] = SettingChange(f.name, value, ChangeStatus.RECEIVED, applies=applies,
                                                 target_epoch=target_epoch, while_paused=paused, elsewhere=True,
                                                 sent_by=sender if isinstance(sender, str) else "")
        return [f.name]

    def applied(self, changes: Iterable[Any], step: int, epoch: int, by_rule: Iterable[Any] = ()) -> list[str]:
        """settings_applied: (name, old, new) for each setting that changed, stamped with the
        epoch about to start (the first one with the new values). `by_rule`: the names the lr
        scaling rule changed (the event says so; nobody asked for those). A change that is not a
        (name, old, new) triple (a damaged row) is passed over."""
        rule = {n for n in by_rule if isinstance(n, str)} if isinstance(by_rule, (list, tuple)) else set()
        touched: list[str] = []
        for change in changes if isinstance(changes, (list, tuple)) else ():
            if not isinstance(change, (list, tuple)) or len(change) != 3:
                continue
            name, _old, new = change
            if not isinstance(name, str) or name not in LIVE_NAMES or new is None:
                continue
            self.engine[name] = new
            prev = self.changes.get(name)
            elsewhere = prev is not None and prev.pending and prev.elsewhere
            self.changes[name] = SettingChange(name, new, ChangeStatus.APPLIED, step=step, epoch=epoch,
                                               by_rule=name in rule, elsewhere=elsewhere,
                                               sent_by=prev.sent_by if elsewhere and prev is not None else "")
            touched.append(name)
        # A value sent that equals what the engine has now changes nothing: nothing to wait for.
        return touched + self._settle(lambda c: True)

    def refused(self, command: str, reason: str) -> list[str]:
        f = setting_of(command)
        if f is None:  # not a setting (a run.db row the engine could not read, say): the alerts show it
            return []
        prev = self.changes.get(f.name)
        self.changes[f.name] = SettingChange(f.name, prev.value if prev else None, ChangeStatus.REFUSED,
                                             reason=reason)
        return [f.name]

    def epoch_reached(self, epoch: int) -> list[str]:
        """Steps of `epoch` arrived. A change whose boundary is behind the run and whose value
        the engine already has was a no-op: say so rather than wait for ever."""
        return self._settle(lambda c: c.boundary_reached(epoch))

    def run_ended(self) -> list[str]:
        touched = [n for n, c in self.changes.items() if c.pending]
        for name in touched:
            self.changes[name] = replace(self.changes[name], status=ChangeStatus.DROPPED)
        return touched

    def _settle(self, due: Callable[[SettingChange], bool]) -> list[str]:
        touched = []
        for name, c in list(self.changes.items()):
            if c.pending and name in self.engine and same(self.engine[name], c.value) and due(c):
                self.changes[name] = replace(c, status=ChangeStatus.UNCHANGED)
                touched.append(name)
        return touched
