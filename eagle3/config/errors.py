"""The error a bad config raises: the key, what was expected and what was given."""


class ConfigError(ValueError):
    pass
