"""The stall watchdog's settings: ``WatchdogConfig`` (the threshold, polling, heartbeat, what the evidence holds,
the signal and fatal-stack options) and ``parse_config``, which reads them from ``$TELEMETRAIN_WATCHDOG``'s value."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

__all__ = ["WatchdogConfig", "parse_config"]


@dataclass(frozen=True)
class WatchdogConfig:
    """``k`` x p99 iteration time, at least ``floor_s``, is a stall; ``startup_s`` until the first report gives a
    p99. ``poll_s``: how often to look (default: a tenth of the threshold, 0.1 to 1 s). ``heartbeat_s``: progress
    records (0: none). ``flight_recorder``: dump torch's Flight Recorder with the evidence when it is on.
    ``on_signal``: evidence on SIGTERM through a signal wakeup fd (only when enabled from the main thread and no one
    else uses the wakeup fd). ``fatal_stacks``: faulthandler's stacks on SIGABRT/SIGSEGV, unless faulthandler is
    already on."""

    k: float = 10.0
    floor_s: float = 60.0
    startup_s: float = 300.0
    poll_s: float | None = None
    heartbeat_s: float = 30.0
    flight_recorder: bool = True
    on_signal: bool = True
    fatal_stacks: bool = True
    stacks_limit: int = 64_000

    def __post_init__(self) -> None:
        for name in ("k", "floor_s", "startup_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        if self.poll_s is not None and (isinstance(self.poll_s, bool) or not isinstance(self.poll_s, (int, float))
                                        or not self.poll_s > 0):
            raise ValueError(f"poll_s must be a number > 0 (or None), got {self.poll_s!r}")
        if isinstance(self.heartbeat_s, bool) or not isinstance(self.heartbeat_s, (int, float)) or \
                self.heartbeat_s < 0:
            raise ValueError(f"heartbeat_s must be a number >= 0, got {self.heartbeat_s!r}")
        if type(self.stacks_limit) is not int or self.stacks_limit < 1000:
            raise ValueError(f"stacks_limit must be an int >= 1000, got {self.stacks_limit!r}")


_TRUE = ("1", "on", "true", "yes")
_FALSE = ("0", "off", "false", "no")
_KEYS = {"k": "k", "floor": "floor_s", "startup": "startup_s", "poll": "poll_s", "heartbeat": "heartbeat_s",
         "flight_recorder": "flight_recorder", "signal": "on_signal", "fatal_stacks": "fatal_stacks"}


def parse_config(text: str) -> WatchdogConfig:
    """``$TELEMETRAIN_WATCHDOG``'s value: ``1``/``on`` (defaults) or ``key=value`` pairs separated by commas (keys:
    k, floor, startup, poll, heartbeat in seconds; flight_recorder, signal, fatal_stacks 0/1, on/off, true/false or
    yes/no; anything else is refused)."""
    text = text.strip().lower()
    if text in ("1", "on", "true", "yes", ""):
        return WatchdogConfig()
    values: dict[str, Any] = {}
    names = {f.name for f in fields(WatchdogConfig)}
    for part in text.split(","):
        key, sep, raw = part.partition("=")
        field_name = _KEYS.get(key.strip())
        if not sep or field_name is None or field_name not in names:
            raise ValueError(f"unknown watchdog setting {part.strip()!r} (keys: {', '.join(_KEYS)})")
        raw = raw.strip()
        if field_name in ("flight_recorder", "on_signal", "fatal_stacks"):
            if raw not in _TRUE + _FALSE:  # (not silently off: "signal=enabled" would have turned it off)
                raise ValueError(f"watchdog setting {key.strip()} must be 0/1, on/off, true/false or yes/no, "
                                 f"got {raw!r}")
            values[field_name] = raw in _TRUE
        else:
            values[field_name] = float(raw)
    return WatchdogConfig(**values)
