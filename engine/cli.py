"""`python -m engine` / `headroom-train`: the headless trainer.

Bad input prints one `error: ...` line on stderr and exits 2, before anything is
written. A run that fails after it started exits 1 with one `error:` line; its
metrics and last checkpoint stay in the run folder.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from typing import Any, Optional, Sequence

from .config import ConfigError, TrainConfig, parse_size

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        raise ConfigError(message)


def _finite_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return v


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return text == "on"


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """The run flags shared by the engine's CLI and the app. Defaults are None so that
    --resume can tell which flags were given."""
    S = argparse.SUPPRESS
    p.add_argument("--task", default=S, help="built-in name (mlp, charlm, cnn-bn), path/to/file.py or module:attr")
    p.add_argument("--micro-batch", type=int, default=S, help="samples per forward/backward (default 16)")
    p.add_argument("--accum", type=int, default=S, help="micro-batches per optimizer step (default 4)")
    p.add_argument("--lr", type=_finite_float, default=S, help="learning rate (default 1e-3)")
    p.add_argument("--clip", type=_finite_float, default=S, help="gradient norm clip, 0 = off (default 1.0)")
    p.add_argument("--epochs", type=int, default=S, help="epochs (default 3)")
    p.add_argument("--max-steps", type=int, default=S, help="stop after N optimizer steps")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default=S)
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default=S)
    p.add_argument("--device", default=S, help="auto, cpu, cuda or cuda:N")
    p.add_argument("--seed", type=int, default=S)
    p.add_argument("--run-dir", default=S, help="folder for run.db and checkpoints")
    p.add_argument("--resume", default=S, metavar="DIR", help="continue the run in DIR from its last checkpoint")
    p.add_argument("--nonfinite", choices=("skip", "stop"), default=S)
    p.add_argument("--lr-scaling", choices=("none", "linear", "sqrt"), default=S,
                   help="how lr follows the effective batch when accumulation changes")
    p.add_argument("--token-budget", type=int, default=S, help="close a window once it holds N counted items")
    p.add_argument("--find-micro-batch", action="store_true", default=S)
    p.add_argument("--effective-batch", type=int, default=S)
    p.add_argument("--memory-margin", type=_finite_float, default=S)
    p.add_argument("--oom-recovery", type=_on_off, default=S, metavar="on|off")
    p.add_argument("--vram-limit", type=_size, default=S, metavar="SIZE", help="simulate a smaller card, e.g. 24GiB")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="headroom-train", description="Headroom's headless trainer (exact gradient accumulation).")
    add_run_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object per event on stdout")
    return p


def config_from_args(ns: argparse.Namespace) -> TrainConfig:
    """Flags given on the command line; for --resume, the run's saved config under them."""
    given = {k: v for k, v in vars(ns).items() if k in TrainConfig.__dataclass_fields__}
    if "resume" in given:
        from .store import RunReader, StoreError
        try:
            reader = RunReader(given["resume"])
            saved = reader.info().get("config") or {}
            reader.close()
        except StoreError as e:
            raise ConfigError(f"--resume {given['resume']}: {e}") from None
        if not isinstance(saved, dict):
            saved = {}
        saved.pop("run_dir", None)
        saved.pop("max_steps", None)  # the limit that stopped the run is not one for its continuation
        base = {**saved, **given}
        base.pop("find_micro_batch", None)
        return TrainConfig.from_dict(base).validate()
    return TrainConfig.from_dict(given).validate()


class ConsoleSink:
    """Progress line on a terminal, or JSON lines with --json."""

    def __init__(self, as_json: bool, total_epochs: int) -> None:
        self.as_json = as_json
        self.tty = sys.stderr.isatty()
        self.total_epochs = total_epochs
        self._last_draw = 0.0
        self.stdout_gone = False

    def __call__(self, event: Any) -> None:
        if self.as_json:
            if self.stdout_gone:
                return
            try:
                sys.stdout.write(json.dumps(event.to_dict(), default=repr) + "\n")
                sys.stdout.flush()
            except BrokenPipeError:  # `| head` went away: keep training, stop printing
                self.stdout_gone = True
                try:
                    sys.stdout = open(os.devnull, "w")
                except OSError:
                    pass
            return
        if event.kind == "step":
            now = time.monotonic()
            if self.tty and now - self._last_draw > 0.1:
                self._last_draw = now
                sys.stderr.write(f"\repoch {event.epoch}/{self.total_epochs} step {event.step} "
                                 f"loss {event.loss:.4f} norm {event.grad_norm:.3g} lr {event.lr:.3g} "
                                 f"{event.micro_batch}x{event.accum} {event.throughput:,.0f}/s   ")
                sys.stderr.flush()
            return
        if event.kind == "checkpoint":
            return
        if self.tty:
            sys.stderr.write("\r\033[K")
        sys.stderr.write(f"[{event.kind}] {event.message()}\n")
        sys.stderr.flush()


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        ns = build_parser().parse_args(argv)
        config = config_from_args(ns)
        from .trainer import Trainer, TrainingError  # torch loads here, after the flags are checked
        trainer = Trainer(config, sink=ConsoleSink(ns.json, config.epochs))
        trainer.prepare()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_FAILED

    def on_signal(signum: int, _frame: Any) -> None:
        trainer.request_stop()  # stop at the next micro-batch, with a checkpoint

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        result = trainer.run()
    except (TrainingError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as e:  # the task's own code failed mid-run: run.db already holds run_failed
        print(f"error: run failed at step {trainer.step}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if result.reason == "nonfinite":
        print(f"error: non-finite loss or gradient at step {result.steps}; stopped with the last good weights "
              f"in {result.run_dir}", file=sys.stderr)
        return EXIT_FAILED
    if not ns.json and trainer.ctx.is_main:
        print(f"run {result.reason}: {result.steps} steps, final loss "
              f"{result.final_loss if result.final_loss is not None else float('nan'):.4f}, folder {result.run_dir}",
              file=sys.stderr)
    return EXIT_OK
