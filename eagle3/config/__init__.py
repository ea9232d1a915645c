"""The typed config every layer reads: the schemas (``schema``), the error a bad config raises
(``errors``), how vLLM engines are built (``engine``) and the other CLIs' schemas (``cli``). It imports nothing else of ours; the
composition wiring (ConfigStore, resolvers, cross-field checks) lives with the stages."""
