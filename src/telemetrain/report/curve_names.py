"""Which of a run's metrics are the user's, which are evaluation metrics, and which is the training loss: the names
the report's curves, ``compare`` and ``tail`` go by (``curves.py`` builds the curves).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["EVAL_WORDS", "is_eval", "is_user_group", "pick_loss"]

EVAL_WORDS = frozenset({"val", "valid", "validation", "eval", "evaluation", "test", "dev"})
_SYSTEM_GROUPS = frozenset({"training", "system", "cross_rank", "telemetrain"})


def is_user_group(group: str) -> bool:
    """A metric the user recorded (``train``, ``val``, ``default``, ...), not one of the training lifecycle's derived
    metrics (``training``), the system sampler's (``system``, ``system.*``) or the cross-rank aggregator's; the same
    split as the findings engine's value series."""
    return group not in _SYSTEM_GROUPS and not group.startswith("system.")


def is_eval(name: str) -> bool:
    """An evaluation metric: a part of its name (split on ``. / _ -``) is val, eval, test, ...: charted by step with
    its points marked (they are few)."""
    parts = name.lower().replace("/", ".").replace("_", ".").replace("-", ".").split(".")
    return any(p in EVAL_WORDS for p in parts)


def pick_loss(names: Iterable[tuple[str, str]], wanted: str | None = None) -> tuple[str, str] | None:
    """The (group, name) of the run's training loss: ``wanted`` when given (a name, or group/name), else a metric
    named ``loss``, ``train/loss``, ``train.loss``, ``train_loss`` (in a group that is not an evaluation group's, when
    there is one), else the first user metric whose name ends in ``loss`` and is not an evaluation metric, else any
    ending in ``loss``."""
    # a name logged in an evaluation group too (``eval``/``loss`` beside ``train``/``loss``): the other group's first
    items = sorted(sorted(names), key=lambda item: is_eval(item[0]))
    if wanted:
        for group, name in items:
            if wanted in (name, f"{group}/{name}", f"{group}.{name}"):
                return group, name
        return None
    for preferred in ("loss", "train/loss", "train.loss", "train_loss", "training_loss", "train/loss_step"):
        for group, name in items:
            if name.lower() == preferred:
                return group, name
    ending = [(g, n) for g, n in items if n.lower().endswith("loss") and is_user_group(g)]
    training = [(g, n) for g, n in ending if not is_eval(n) and not is_eval(g)]
    found = training or ending
    return found[0] if found else None
