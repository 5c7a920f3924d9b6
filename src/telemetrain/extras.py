"""One clear ``ImportError`` when an optional extra is missing: what needs it and the command that installs it, not
chained to the original error (whose text it carries), so the line to act on is the only message shown."""

from __future__ import annotations

__all__ = ["missing_extra"]


def missing_extra(what: str, needs: str, extra: str, cause: ImportError) -> ImportError:
    """``raise missing_extra("telemetrain.sinks.prometheus", "prometheus_client", "prometheus", exc) from None``."""
    error = ImportError(f"{what} needs {needs} ({cause}): pip install 'telemetrain[{extra}]'",
                        name=getattr(cause, "name", None))
    return error
