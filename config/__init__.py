"""Configuration: frozen dataclasses (:mod:`.schema`) loaded from YAML and CLI overrides (:mod:`.loader`)."""

from fastfs.config.loader import ConfigError, load_config, parse_overrides
from fastfs.config.schema import Config

__all__ = ["Config", "ConfigError", "load_config", "parse_overrides"]
