"""Real acceptance of an exported head, measured by vLLM (its CLI stage: eagle3/stages/evaluate.py).
The serving speed-up and its advice have a room of their own (eagle3/serving/).

acceptance.py        evaluate(): held-out prompts -> both engines -> report, plot, W&B
prompts.py           held-out prompts: the suite, HumanEval; the validation split (in-distribution)
suite.py, suites/    the project's held-out suite: 8 MT-bench categories x 12, math word problems
intervals.py         bootstrap intervals over prompts from vLLM's per-request figures
breakdown.py         per category: from per-request figures, or from each category's counters
engine.py            one vLLM engine in its own process (with engine_feed.py, the only vllm imports)
engine_feed.py       how prompts reach it: waves, a queue, or step by step (step_tally.py: each
                     request's figures rebuilt from each step's tokens where vLLM gives none)
category_calls.py    without per-request figures: a set run one category (or prompt) per call, merged back
subprocess_engine.py runs it, with logs, timeout and clean stop
counters.py          vLLM's spec-decode counters and the figures they give
figures.py           per prompt set: acceptance, tokens/s with/without head (the eval engines'
                     ratio, not a serving figure), greedy match
acceptance_run.py    the acceptance run: with-head engine, then without-head engine, same prompts
report.py            acceptance.json and the table; plot.py the PNG; wandb_log.py W&B
gap.py               two heads on the same prompts: B minus A per set, with a paired bootstrap interval
diagnostics/         train-side figures beside vLLM's: the replays of an export on a dataset
                     and on vLLM's own outputs, and why a greedy output changed
"""
