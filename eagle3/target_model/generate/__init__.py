"""The target answers the chat data's user turns itself (data.regenerate=true).

common.py       the Regenerator base both engines share: turns, the answer cache, seeds
vllm_engine.py  VLLMRegenerator (vLLM)
hf_engine.py    HFRegenerator (transformers; fast_decode.py for Llama-family targets)
dispatch.py     make_regenerator: the engine named by data.regen_backend
"""
