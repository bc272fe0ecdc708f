"""Notifications through Apprise (`--notify URL`, `HEADROOM_NOTIFY`): one URL reaches ntfy,
Slack, Discord, Telegram, Matrix, e-mail and the rest of Apprise's services.

Sent when a run ends (completed, stopped, max steps, failed, gave up, non-finite stop: with the
final loss and the duration), on a rollback, and on the first out-of-memory or loss-weighting
alert (the latter from the framework integrations: engine/integrations/loop.py listens to its
store, RunStore.listener). Each message
names the run and its folder as host:path (the host says where a server run lives).

Sending never touches the training thread: the trainer hands events to `Notifier.on_event`,
which only queues a message; a daemon thread sends. A message that cannot be delivered is
said once, as a `notify_failed` event the trainer writes (`Notifier.failure`); the run never
fails or waits for it. At the end the trainer gives the last message END_WAIT seconds to go
(`close`), so it is sent, or its failure recorded, before run.db closes.

Torch-free, Qt-free; `apprise` is the optional extra `notify`, imported only when a URL is given.
"""
from __future__ import annotations

import math
import os
import queue
import socket
import threading
import time
from typing import Any, Mapping, Optional, Sequence

from engine.declarations.config import ConfigError
from engine.declarations.events import Event, NotifyFailed

ENV = "HEADROOM_NOTIFY"  # Apprise URLs separated by spaces, used when --notify is not given
NEEDS_EXTRA = "needs the notify extra (pip install 'headroom[notify]')"  # after --notify or HEADROOM_NOTIFY
END_WAIT = 10.0  # seconds the run's end gives its last message (Apprise's own socket timeouts are 4 s)
_DONE = None  # the queue's end marker


def notify_urls(given: Sequence[str], environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The URLs of a run: --notify's, else HEADROOM_NOTIFY's (separated by spaces)."""
    urls = tuple(u for text in given for u in str(text).split())
    return urls or tuple(environ.get(ENV, "").split())


def checked(urls: Sequence[str], who: str = "--notify") -> Any:
    """An apprise.Apprise holding every URL, or ConfigError (one line, naming `who`: the flag or
    HEADROOM_NOTIFY) when the extra is missing or Apprise cannot read a URL. Called before
    anything is written."""
    if not urls:
        return None
    try:
        import apprise
    except ImportError:
        raise ConfigError(f"{who} {NEEDS_EXTRA}") from None
    services = apprise.Apprise()
    for url in urls:
        if not services.add(url):
            raise ConfigError(f"{who} {url}: not a URL Apprise can send to (see "
                              "https://github.com/caronc/apprise/wiki for the services and their URLs)")
    return services


def duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


class Notifier:
    """Turns a run's events into messages and sends them on its own thread (see the module doc)."""

    def __init__(self, urls: Sequence[str], run_dir: str, host: Optional[str] = None) -> None:
        self._services = checked(urls)
        self.name = os.path.basename(os.path.normpath(run_dir))
        self.where = f"{host or socket.gethostname()}:{os.path.abspath(run_dir)}"
        self._queue: "queue.Queue[Optional[tuple[str, str, str]]]" = queue.Queue()
        self._lock = threading.Lock()
        self._failure = ""  # the first undelivered message's reason, until the trainer takes it
        self._said = False  # notify_failed was written: once per run
        self._started = time.monotonic()
        self._loss: Optional[float] = None  # the last applied step's
        self._rollbacks = 0
        self._oom_said = False
        self._weighting_said = False
        self._thread = threading.Thread(target=self._send_all, name="headroom-notify", daemon=True)
        self._thread.start()

    # -- the training thread: cheap, never blocks ---------------------------------------------------
    def on_event(self, event: Event) -> None:
        message = self._message(event)
        if message is not None:
            self._queue.put(message)

    def failure(self, step: int, epoch: int) -> Optional[NotifyFailed]:
        """The notify_failed event to write, the first time a message was not delivered; else None."""
        with self._lock:
            if not self._failure or self._said:
                return None
            self._said = True
            return NotifyFailed(step, epoch, reason=self._failure)

    def close(self, wait: float = END_WAIT) -> None:
        """The run has ended: give the queued messages up to `wait` seconds, then leave the thread
        (a daemon) to whatever it still holds."""
        self._queue.put(_DONE)
        self._thread.join(timeout=wait)
        if self._thread.is_alive():
            self._failed(f"not delivered within {wait:g} s of the run's end (is the service reachable?)")

    # -- what is said -------------------------------------------------------------------------------
    def _message(self, e: Event) -> Optional[tuple[str, str, str]]:
        kind = e.kind
        if kind == "step":
            loss = getattr(e, "loss", None)
            if not getattr(e, "nonfinite", False) and isinstance(loss, float) and math.isfinite(loss):
                self._loss = loss
            return None
        if kind == "run_started":
            self._started = time.monotonic()
            return None
        if kind == "rolled_back":
            self._rollbacks += 1
            return self._said_as("rolled back", e.message(), "warning", e)
        if kind == "oom_recovered" and not self._oom_said:
            self._oom_said = True
            return self._said_as("ran out of memory", e.message() + " (later out-of-memory alerts are not sent)",
                                 "warning", e)
        if kind == "loss_weighting" and not self._weighting_said:  # a framework's loss, off the exact one
            self._weighting_said = True
            return self._said_as("has a loss weighting alert", e.message() + " (later ones are not sent)", "warning", e)
        if kind == "run_finished":
            reason = getattr(e, "reason", "")
            word = {"completed": "completed", "max_steps": "reached its step limit", "stopped": "was stopped"}.get(
                reason, "gave up" if self._rollbacks else "stopped at a non-finite step")
            return self._said_as(word, self._ending(e), "success" if reason in ("completed", "max_steps", "stopped")
                                 else "failure", e)
        if kind == "run_failed":
            return self._said_as("failed", f"{getattr(e, 'error', '')}; {self._ending(e)}", "failure", e)
        return None

    def _ending(self, e: Event) -> str:
        loss = f"final loss {self._loss:.4f}" if self._loss is not None else "no finite loss yet"
        return f"{loss}, after {duration(time.monotonic() - self._started)}"

    def _said_as(self, what: str, detail: str, level: str, e: Event) -> tuple[str, str, str]:
        title = f"Headroom: run {self.name} {what}"
        body = f"Run {self.name} {what} at step {e.step} (epoch {e.epoch}): {detail}\nFolder: {self.where}"
        return title, body, level

    # -- the sending thread -------------------------------------------------------------------------
    def _send_all(self) -> None:
        while (message := self._queue.get()) is not _DONE:
            self._send(*message)

    def _send(self, title: str, body: str, level: str) -> None:
        said: list[str] = []  # Apprise's own words for what went wrong
        try:
            result = self._services.notify(body=body, title=title, notify_type=level,
                                           log_callback=lambda entry, _plugin: said.append(str(entry.message)))
            if not result:
                self._failed(f"{title!r} not delivered: {said[-1] if said else 'the service refused it'}")
        except Exception as e:  # a plugin's surprise: the run goes on, the reason is said
            self._failed(f"{title!r} not delivered: {type(e).__name__}: {e}")

    def _failed(self, reason: str) -> None:
        with self._lock:
            if not self._failure:
                self._failure = reason


def notifier_for(given: Sequence[str], run_dir: str) -> Optional[Notifier]:
    """The run's Notifier, or None without URLs. ConfigError as `checked` says."""
    urls = notify_urls(given)
    return Notifier(urls, run_dir) if urls else None
