"""Units: is a record's unit UCUM (what OpenTelemetry asks for), and what is it in base units (what Prometheus asks
for)?

Records carry UCUM units (``s``, ``By``, ``J``, ``1``, ``{token}/s``): https://ucum.org/ucum, as OpenTelemetry's
semantic conventions use them (``By`` for bytes, ``Cel`` for degrees Celsius, ``{thing}`` annotations for counts).
``is_ucum`` is a structural check of the common forms, not the whole grammar: terms joined by ``.`` and ``/``, each
an atom with an optional metric (or, for ``By``/``bit``, binary) prefix and exponent, an annotation, or ``1``.
Standard library only.
"""

from __future__ import annotations

import re

__all__ = ["base_unit", "is_ucum"]

# atoms a training job's metrics use (UCUM's base and derived units, and the customary ones OTel uses)
_ATOMS = frozenset({
    "s", "min", "h", "d", "wk", "mo", "a",  # time
    "By", "bit", "Bd",  # information
    "J", "W", "Wh", "V", "A", "Ohm", "Hz", "Cel", "K", "Pa", "N", "g", "m", "L", "l", "rad", "deg", "%", "eV",
})
_METRIC_PREFIXES = ("Y", "Z", "E", "P", "T", "G", "M", "k", "h", "da", "d", "c", "m", "u", "n", "p", "f", "a")
_BINARY_PREFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_UNPREFIXED = frozenset({"min", "h", "d", "wk", "mo", "a", "%", "deg"})  # customary units take no prefix
_TERM = re.compile(r"^(?P<atom>[A-Za-z%]+)(?P<exp>-?\d+)?(?P<ann>\{[^{}]*\})?$")
_ANNOTATION = re.compile(r"^\{[^{}]*\}$")


def _atom_ok(atom: str) -> bool:
    if atom in _ATOMS:
        return True
    for prefix in _BINARY_PREFIXES:
        if atom.startswith(prefix) and atom[len(prefix):] in ("By", "bit"):
            return True
    for prefix in _METRIC_PREFIXES:
        rest = atom[len(prefix):]
        if atom.startswith(prefix) and rest in _ATOMS and rest not in _UNPREFIXED:
            return True
    return False


def _term_ok(term: str) -> bool:
    if term == "1" or _ANNOTATION.match(term):
        return True
    if term.startswith("10*") or term.startswith("10^"):  # a power of ten as a factor
        return term[3:].lstrip("-").isdigit()
    found = _TERM.match(term)
    return found is not None and _atom_ok(found["atom"])


def is_ucum(unit: str) -> bool:
    """Whether ``unit`` is a (common) UCUM unit; ``""`` (no unit) counts as fine."""
    if not unit:
        return True
    if unit.startswith("/"):
        unit = "1" + unit
    terms = re.split(r"[./]", unit)
    return all(terms) and all(_term_ok(t) for t in terms)


# unit -> (base unit, factor): a value in ``unit`` times ``factor`` is in the base unit (Prometheus' rule: base units)
_TIME = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_BYTES = {
    "By": 1.0, "kBy": 1e3, "MBy": 1e6, "GBy": 1e9, "TBy": 1e12, "PBy": 1e15,
    "KiBy": 2.0**10, "MiBy": 2.0**20, "GiBy": 2.0**30, "TiBy": 2.0**40, "PiBy": 2.0**50,
}
_BASE: dict[str, tuple[str, float]] = {
    **{u: ("s", f) for u, f in _TIME.items()},
    **{u: ("By", f) for u, f in _BYTES.items()},
    "bit": ("By", 1 / 8), "%": ("1", 0.01), "mW": ("W", 1e-3), "kW": ("W", 1e3), "kJ": ("J", 1e3),
    "Wh": ("J", 3600.0), "kWh": ("J", 3.6e6), "kHz": ("Hz", 1e3), "MHz": ("Hz", 1e6), "GHz": ("Hz", 1e9),
}


def base_unit(unit: str) -> tuple[str, float]:
    """(the base unit, the factor to it) of a unit: ``ms`` -> (``s``, 0.001), ``MiBy`` -> (``By``, 1048576); a
    rate over a prefixed unit too (``MiBy/s`` -> ``By/s``). Anything else is its own base (factor 1)."""
    found = _BASE.get(unit)
    if found is not None:
        return found
    head, sep, tail = unit.partition("/")
    if sep and head in _BASE and tail in _TIME:
        base, factor = _BASE[head]
        return f"{base}/s", factor / _TIME[tail]
    return unit, 1.0
