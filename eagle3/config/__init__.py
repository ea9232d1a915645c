"""Config schemas, their ConfigStore registration, and the resolvers the YAMLs use."""

from eagle3.config.registry import register_configs

__all__ = ["register_configs"]
