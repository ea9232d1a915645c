"""Everything that runs the target model; nothing here is imported at package import.

resolve.py          where a target's weights come from (SmolLM2 GGUF, tiny, hf), its facts checked
hub.py              local directory or hub id -> a directory on this machine
records.py          CaptureSpec, CapturedSample, CaptureError: what a capture must look like
adapter.py          each backend's raw output -> one checked CapturedSample
backend.py          the CaptureBackend protocol extraction calls, and the one named by config
capture_hf.py       capture through transformers (hooks)
capture_vllm.py     capture through vLLM (a KV connector writes one file per request)
vllm_internals.py   the one module that touches vLLM internals (the connector)
vllm_versions.py    which vLLM releases capture and evaluation run with
host_copy.py        device -> host copy of a captured batch, overlapped with the next forward
generate/           the target answering the chat data's user turns (regeneration engines)
"""
