"""Lightning training of the draft head: data, module, logging, checkpoints, export.

datamodule.py        the dataset (and the selection set) as packed batches, decoded on the device
module.py            the Lightning module: the step (supervised, or mixed with the on-policy
                     objective), validation per set (val/*, select/*), the lr schedule
builder.py           the head from the config, the target's frozen weights and the dataset's vocab
init_from.py         a warm start from an export or a hub id (train.init_from)
online.py            the target run by the trainer (train.hidden_states=online)
callbacks.py         checkpoint, throughput/ETA, early stopping; checkpoint_io.py, final_checkpoint.py
                     atomic saves, the disk they need, the last head kept when it is the best
schedule.py          warm-up + cosine, fitted to a wall-clock cap; step_path.py: attention, compile, precision
loggers.py           W&B (offline by default); fit_record.py: passes made against planned;
validation_trend.py  what twice the minutes would buy, by the picking metric's trend (with its interval)
run_dir.py           one training per run dir, a rerun's config checked against the recorded one
"""
