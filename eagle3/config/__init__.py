"""The typed config every layer reads: the schemas (``schema``: the run's, with its groups in
``target``, ``dataset`` and ``training``; their enumerations in ``choices``), the error a bad config raises
(``errors``), how vLLM engines are built (``engine``) and the other CLIs' schemas (``cli``). It imports nothing else of ours; the
composition wiring (ConfigStore, resolvers, cross-field checks) lives with the stages."""
