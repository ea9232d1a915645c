"""The typed config: the schemas every layer reads (``schema``, importing nothing of ours), and
the composition wiring only the stages and CLI entries use (``registry``: ConfigStore and the
``eagle3.*`` resolvers, ``register_configs``; ``validate``: checks across fields)."""
