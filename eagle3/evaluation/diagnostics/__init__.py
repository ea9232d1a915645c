"""What explains a gap between the train-side figures and vLLM's: the head replayed on a
dataset (replay_export), on vLLM's own with-head outputs (served_replay), and each greedy
output that changed with the head rerun through the target in fp32 (mismatch)."""
