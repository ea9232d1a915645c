"""The stages: the only code that reads the whole composed config and calls down into
training, evaluation, extraction, the target, the store and the draft. With them, what only
composition needs: Hydra's ConfigStore and resolvers (compose), checks across fields
(validate), the multirun callback (sweep). The planner (costs, time budget, disk) is
eagle3/planning/; each CLI's schema is eagle3/config/cli.py.

    extract.py     -> stages.extract.run     (narrow: the dataset's identity from the config;
                                              selection: the selection set's own config, written first)
    train.py       -> stages.train.run       (train_inputs: the dataset found and checked; train_parts:
                                              data module, head, module, logger, callbacks, trainer;
                                              fit_report: the passes made)
    evaluate.py    -> stages.evaluate.run
    export.py      -> stages.export.run
    polish.py      -> stages.polish.run      (rounds of extract + train from an export; polish_state,
                                              polish_log: its resumable record and W&B panels)
    python -m eagle3.stages.replay_export -> stages.replay_export.run
"""
