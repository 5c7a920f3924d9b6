"""The checks of the public APIs' arguments (names, values, steps, metric attributes): each accepts what the API
documents and raises a ``TypeError``/``ValueError`` naming the argument otherwise. The hot paths test the common case
inline and call these only for the rest."""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Mapping
from typing import Any

# The run store's integer fields are 64-bit (the reader and the columnar copy refuse the rest): one past it, accepted
# at the call, was written and then skipped by every reader as a corrupt line.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


# The longest str an event's attribute may hold, in characters: encoded (JSON escapes at most 6 bytes a character),
# it still fits a run store line (``store.layout.MAX_LINE_BYTES``, 4 MiB) with room for the rest. A longer one is
# refused at the call: the writer thread could only drop the whole record (docs/format.md).
MAX_ATTRIBUTE_CHARS = 512 << 10


def check_attribute_lengths(attributes: Mapping[str, Any], arg: str) -> None:
    """ValueError naming the first str value of ``attributes`` longer than ``MAX_ATTRIBUTE_CHARS``."""
    for key, value in attributes.items():
        if isinstance(value, str) and len(value) > MAX_ATTRIBUTE_CHARS:
            raise ValueError(f"{arg}[{key!r:.80}] is a str of {len(value)} characters, more than a run store line "
                             f"holds ({MAX_ATTRIBUTE_CHARS}): record a summary or a path to the data instead")


def _short(value: Any) -> str:
    """A wrong argument's repr for the message: a repr that raises must not replace the TypeError naming it."""
    try:
        return f"{value!r:.80}"
    except Exception:  # noqa: BLE001 - only for the message
        return "<unprintable>"


def check_value(value: Any, arg: str) -> int | float | bool:
    """The slow path of every numeric argument: accept real numbers (numpy scalars too), refuse the rest."""
    if isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", None) == "b":
        return bool(value)  # numpy.bool_ is no numbers.Integral
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    hint = ""
    if hasattr(value, "item") and hasattr(value, "dim"):
        hint = " (a tensor: pass tensor.item() yourself; telemetrain never calls it because it syncs the device)"
    raise TypeError(f"{arg} must be an int or float, got {type(value).__name__}: {_short(value)}{hint}")


def check_seconds(value: Any, arg: str) -> float:
    """A duration in seconds: a real number, not NaN. One past what a thread can wait (``inf`` included) becomes
    ``threading.TIMEOUT_MAX``: the waits raised OverflowError (an interval's in the writer thread, which died)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{arg} must be a number of seconds, got {type(value).__name__}: {_short(value)}")
    seconds = float(value)
    if math.isnan(seconds):
        raise ValueError(f"{arg} must be a number of seconds, got nan")
    return min(seconds, threading.TIMEOUT_MAX)


def check_timeout(timeout: Any, arg: str = "timeout") -> float | None:
    """A timeout: None or ``inf`` (or more than a thread can wait) for none, else seconds (negative: don't wait)."""
    if timeout is None:
        return None
    seconds = check_seconds(timeout, arg)
    return None if seconds >= threading.TIMEOUT_MAX else seconds


def check_name(name: Any, arg: str) -> str:
    """A non-empty str; a str subclass (a str Enum member, say) becomes the plain str of its text."""
    if not isinstance(name, str):
        raise TypeError(f"{arg} must be a str, got {type(name).__name__}")
    text: str = name if type(name) is str else str.__str__(name)  # str() of an Enum member gives "Cls.MEMBER"
    if not text:
        raise ValueError(f"{arg} must be a non-empty str")
    return text


def check_step(step: Any) -> int:
    """A step is a whole number: an int, a numpy integer, or a float with no fractional part."""
    if isinstance(step, bool) or not isinstance(step, numbers.Real):
        raise TypeError(f"step must be an int, got {type(step).__name__}")
    if isinstance(step, numbers.Integral):
        whole = int(step)
    else:
        as_float = float(step)
        if not as_float.is_integer():
            raise ValueError(f"step must be a whole number, got {step!r}")
        whole = int(as_float)
    if not INT64_MIN <= whole <= INT64_MAX:
        raise ValueError(f"step is out of the signed 64-bit range ({whole.bit_length()}-bit magnitude)")
    return whole


_ATTRIBUTE_VALUE_TYPES = (str, int, float, bool)
_ATTRIBUTE_VALUE_SET = frozenset(_ATTRIBUTE_VALUE_TYPES)


def check_metric_attributes(attributes: Any) -> None:
    """A metric's attributes: a mapping of non-empty str keys to str, int, float or bool values (dimension labels:
    a backend makes each distinct set its own series)."""
    if not isinstance(attributes, Mapping):
        raise TypeError(f"attributes must be a mapping, got {type(attributes).__name__}")
    for key, value in attributes.items():
        if type(key) is not str or not key:
            raise TypeError(f"attributes keys must be non-empty str, got {_short(key)}")
        if type(value) not in _ATTRIBUTE_VALUE_TYPES:
            raise TypeError(f"attributes[{key!r}] must be a str, int, float or bool (a dimension label), got "
                            f"{type(value).__name__}: {_short(value)}")
