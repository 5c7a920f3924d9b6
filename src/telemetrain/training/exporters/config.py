"""Declarative exporters (``nv_one_logger.exporter.exporter_config`` / ``export_config_manager``): an exporter is a
``class_name`` (a dotted import path), its constructor keyword arguments (``config``) and ``enabled``.

Sources, lowest priority first: package defaults from the entry-point groups ``telemetrain.exporter_configs`` and
one-logger's ``nv_one_logger.exporter_configs`` (each entry names a class with a ``get_default_config()``); a JSON
file (YAML too when PyYAML is installed) holding ``{"exporters": [...]}``, found by the explicit path, then
``$ONE_LOGGER_EXPORTER_CONFIG_PATH``, then ``./one_logger_exporters_config.{yaml,yml,json}`` (a file replaces the
package defaults); then the configs given in code, merged per ``class_name``.

one-logger's own class names (``nv_one_logger.exporter.file_exporter.FileExporter``, its ``LoggerExporter`` and
``OTelExporter``) build telemetrain's exporters when nv-one-logger is not installed, so a config file written for
one-logger keeps working. A config given in code that names a class that cannot be built is a ``ValueError``; one
from a file or a package is warned about and skipped.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...dispatch import describe, warn_safely
from .base import check_exporter

__all__ = ["ExporterConfig", "ExporterConfigManager"]

_GROUPS = ("telemetrain.exporter_configs", "nv_one_logger.exporter_configs")
_ENV = "ONE_LOGGER_EXPORTER_CONFIG_PATH"
_CWD_FILES = ("one_logger_exporters_config.yaml", "one_logger_exporters_config.yml", "one_logger_exporters_config.json")
_ONE_LOGGER_CLASSES = {
    "nv_one_logger.exporter.file_exporter.FileExporter": "telemetrain.training.exporters.FileExporter",
    "nv_one_logger.exporter.logger_exporter.LoggerExporter": "telemetrain.training.exporters.LoggerExporter",
    "nv_one_logger.otel.exporter.otel_exporter.OTelExporter": "telemetrain.training.exporters.OTelExporter",
}


@dataclasses.dataclass
class ExporterConfig:
    class_name: str
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    enabled: bool = True


class ExporterConfigManager:
    ENTRY_POINT_NAME = _GROUPS[1]

    def __init__(self) -> None:
        self.entry_point_exporter_configs = self._entry_point_configs()

    def generate_export_config(
        self, direct_config: Sequence[ExporterConfig | Mapping[str, Any]] | None = None,
        config_file_path: str | os.PathLike[str] | None = None,
    ) -> list[ExporterConfig]:
        configs = self._package_configs()
        from_file = self._file_configs(config_file_path)
        if from_file is not None:
            configs = from_file
        if direct_config:
            configs = _merge(configs, _build(direct_config, "exporters_config"))
        return configs

    def create_exporters_from_config(self, exporters_config: Sequence[ExporterConfig],
                                     training_telemetry_config: Any = None, *, strict: bool = False) -> list[Any]:
        """The exporters of the enabled configs (``strict``: a config that cannot be built raises ``ValueError``;
        else it is warned about and skipped)."""
        exporters = []
        for config in exporters_config:
            if not config.enabled:
                continue
            try:
                exporters.append(_create(config))
            except Exception as exc:
                if strict:
                    raise ValueError(f"exporter {config.class_name!r} cannot be built: {describe(exc)}") from exc
                warn_safely(f"telemetrain: exporter {config.class_name!r} cannot be built and is skipped: "
                            f"{describe(exc)}", stacklevel=3)
        return exporters

    def _entry_point_configs(self) -> dict[str, Any]:
        from importlib.metadata import entry_points  # (a heavy import: only when configs are read)

        found: dict[str, Any] = {}
        for group in _GROUPS:
            for entry in entry_points(group=group):
                try:
                    found[entry.name] = entry.load()
                except Exception as exc:  # noqa: BLE001 - another package's entry point
                    warn_safely(f"telemetrain: exporter config entry point {entry.name!r} failed to load: "
                                f"{describe(exc)}", stacklevel=3)
        return found

    def _package_configs(self) -> list[ExporterConfig]:
        configs = []
        for name, holder in self.entry_point_exporter_configs.items():
            try:
                default = holder.get_default_config()
                configs.append(ExporterConfig(default["class_name"], dict(default.get("config", {})),
                                              bool(default.get("enabled", True))))
            except Exception as exc:  # noqa: BLE001
                warn_safely(f"telemetrain: exporter config {name!r} has no usable default: {describe(exc)}",
                            stacklevel=3)
        return configs

    def _file_configs(self, config_file_path: str | os.PathLike[str] | None) -> list[ExporterConfig] | None:
        path = _find_file(config_file_path)
        if path is None:
            return None
        try:
            text = path.read_text(encoding="utf-8")
            if path.suffix.lower() in (".yaml", ".yml"):
                data = importlib.import_module("yaml").safe_load(text)  # optional: only a YAML file needs PyYAML
            else:
                data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("exporters"), list):
                raise ValueError("expected an object with an 'exporters' list")
            return _build(data["exporters"], str(path))
        except Exception as exc:  # noqa: BLE001
            warn_safely(f"telemetrain: exporter config file {path} is ignored: {describe(exc)}", stacklevel=3)
            return None


def _find_file(config_file_path: str | os.PathLike[str] | None) -> Path | None:
    candidates: list[Path] = []
    if config_file_path:
        candidates.append(Path(config_file_path))
    if os.environ.get(_ENV):
        candidates.append(Path(os.environ[_ENV]))
    candidates.extend(Path.cwd() / name for name in _CWD_FILES)
    return next((path for path in candidates if path.is_file()), None)


def _build(entries: Sequence[ExporterConfig | Mapping[str, Any]], where: str) -> list[ExporterConfig]:
    out = []
    for entry in entries:
        if isinstance(entry, ExporterConfig):
            out.append(entry)
        elif isinstance(entry, Mapping) and isinstance(entry.get("class_name"), str):
            out.append(ExporterConfig(entry["class_name"], dict(entry.get("config") or {}),
                                      bool(entry.get("enabled", True))))
        else:
            raise TypeError(f"{where}: each exporter must be an ExporterConfig or a mapping with a class_name, got "
                            f"{entry!r}")
    return out


def _merge(base: list[ExporterConfig], override: list[ExporterConfig]) -> list[ExporterConfig]:
    merged = {config.class_name: config for config in base}
    for config in override:
        previous = merged.get(config.class_name)
        if previous is not None:
            config = dataclasses.replace(config, config={**previous.config, **config.config})
        merged[config.class_name] = config
    return list(merged.values())


def _create(config: ExporterConfig) -> Any:
    class_name = config.class_name
    module_name, _, attr = class_name.rpartition(".")
    if not module_name:
        raise ValueError("class_name must be a dotted import path (module.Class)")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        alias = _ONE_LOGGER_CLASSES.get(class_name)
        if alias is None:
            raise
        module_name, _, attr = alias.rpartition(".")
        module = importlib.import_module(module_name)
    exporter = getattr(module, attr)(**config.config)
    check_exporter(exporter, class_name)
    return exporter
