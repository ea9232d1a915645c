"""The names of an export directory's files, one constant each, and the groups its owner works
with. What each file holds and who writes it: eagle3/serving/export_dir.py, the directory's
owner. The names sit here, at the draft layer, because every layer that writes or reads one of
them imports them: the serving format (draft/), the acceptance report and the export's reader
(evaluation/), the advice, the card and the upload (serving/), the stages."""

from __future__ import annotations

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
META = "eagle3_meta.json"
CARD = "README.md"
ADVICE = "serving.json"
SPEEDUP = "serving_speedup.json"
ACCEPTANCE = "acceptance.json"
ACCEPTANCE_PLOT = "acceptance.png"
ENGINE_LOGS = "acceptance-logs"
WANDB = "wandb"
SERVING_WORK = "serving_work"

# what save_head writes (the serving format); eagle3_meta.json also gets the training record later
FORMAT_FILES = (CONFIG, WEIGHTS, META)
# what the publish step writes from the files above (the card) or rewrites from the run dir
PUBLISHED_FILES = (CARD,)
# what a measurement of these weights writes (python evaluate.py, serving.measure=true)
MEASUREMENTS = (ACCEPTANCE, ACCEPTANCE_PLOT, ADVICE, SPEEDUP, ENGINE_LOGS)
# folders that stay local: never uploaded to the Hub (serving_work: the serving measurement's
# engines beside its JSON, when that JSON is written into the export)
LOCAL_ONLY = (ENGINE_LOGS, WANDB, SERVING_WORK)
# everything an export directory may hold: a directory holding anything else is not an export's
EXPORT_FILES = frozenset((*FORMAT_FILES, *PUBLISHED_FILES, *MEASUREMENTS, WANDB))
