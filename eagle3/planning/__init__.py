"""What a run will cost and store, computed before it starts: the planner the stages consult.

cost.py           token counts and times from the measured rates (rates.yaml beside it)
time_budget.py    one wall-clock budget over extraction, training and the acceptance evaluation
                  (its TimeShares: the minutes per part and the conversations they size the data to)
disk_estimate.py  the dataset's bytes per token and the training checkpoints' disk
rates.yaml        the measured throughputs, each with the command that measured it
"""
