"""Real acceptance of an exported head, measured by vLLM (the stage: eagle3/stages/evaluate.py).

prompts.py           held-out prompts: validation-split opening turns + HumanEval
engine.py            one vLLM engine in its own process (the only vllm import)
subprocess_engine.py runs it, with logs, timeout and clean stop
counters.py          vLLM's spec-decode counters and the figures they give
figures.py           per prompt set: acceptance, tokens/s with/without head, greedy match
measure.py           with-head engine, then without-head engine, same prompts
report.py            acceptance.json and the table; plot.py the PNG; wandb_log.py W&B
"""
