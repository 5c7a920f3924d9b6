"""The demo's data: the Python source code of a few standard-library modules, read at run time.

Every CPython install ships these ``.py`` files next to the interpreter, so the demo trains on real text without a
download, a data file in the package or network access. ``inspect.getsource`` reads them; a module whose source is
missing (some stripped or frozen installs) is skipped, and telemetrain's own source is used when none is found.

This module imports torch: only ``telemetrain demo`` imports it, never ``import telemetrain``.
"""

from __future__ import annotations

import importlib
import inspect

import torch
from torch.utils.data import Dataset

__all__ = ["SOURCE_MODULES", "VOCAB", "CharWindows", "decode", "encode", "load_corpus"]

# About 200k characters in all: enough that a few hundred steps never see the same window twice.
SOURCE_MODULES = ("argparse", "textwrap", "json.decoder", "json.encoder", "string", "csv", "pprint")
_FALLBACK_MODULES = ("telemetrain.telemetry", "telemetrain.metrics", "telemetrain.events", "telemetrain.store.reader")
MIN_CHARS = 20_000

# A fixed vocabulary (not one built from the text) so that a checkpoint means the same on every Python version:
# index 0 stands for any character outside printable ASCII and newline.
UNKNOWN = "\x00"
VOCAB = UNKNOWN + "\n" + "".join(chr(c) for c in range(32, 127))
_INDEX = {c: i for i, c in enumerate(VOCAB)}


def load_corpus(modules: tuple[str, ...] = SOURCE_MODULES) -> tuple[str, list[str]]:
    """The concatenated source of ``modules`` and the names actually read."""
    texts: list[str] = []
    used: list[str] = []
    for names in (modules, _FALLBACK_MODULES):
        for name in names:
            try:
                texts.append(inspect.getsource(importlib.import_module(name)))
            except (ImportError, OSError, TypeError):  # no source shipped for this module
                continue
            used.append(name)
        if sum(map(len, texts)) >= MIN_CHARS:
            break
    text = "\n".join(texts)
    if len(text) < MIN_CHARS:
        raise RuntimeError(
            f"the demo needs Python source files to train on, but only {len(text)} characters were found "
            f"(modules tried: {', '.join(modules + _FALLBACK_MODULES)})"
        )
    return text, used


def encode(text: str) -> list[int]:
    get = _INDEX.get
    return [get(c, 0) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] if i else "?" for i in ids)


class CharWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``(input, target)`` pairs of ``context`` characters, the target shifted by one: next-character prediction
    at every position. Windows start every ``stride`` characters (1 for training; ``context`` for a validation set
    without overlap)."""

    def __init__(self, ids: torch.Tensor, context: int, stride: int = 1) -> None:
        if ids.dim() != 1 or len(ids) < context + 2:
            raise ValueError(f"need a 1-d tensor of at least {context + 2} ids, got shape {tuple(ids.shape)}")
        self.ids = ids
        self.context = context
        self.stride = stride
        self._len = (len(ids) - context - 1) // stride + 1

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self._len:
            raise IndexError(index)
        start = index * self.stride
        return self.ids[start : start + self.context], self.ids[start + 1 : start + self.context + 1]
