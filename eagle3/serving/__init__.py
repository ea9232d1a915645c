"""What a head buys in serving, and how to serve it: its own room, above the acceptance
evaluation whose engines it runs.

speedup.py       tok/s of the target alone and with the head, per load and K (serving.measure=true)
speedup_table.py its tables: natural EOS from a queue (the speed-ups advised), step-cost waves (ignore_eos)
advice.py        how many draft tokens to serve with, per load (the export's serving.json), and
                 the one `vllm serve` command train.py and export.py print
step_costs.yaml  a verify step's cost in plain decode steps, per size class of target
export_dir.py    the export directory's owner: every file and its writer, write_export, publish_export
hub_upload.py    what a push uploads (no local path) and deletes (the previous head's files); hub_push.py sends it
"""
