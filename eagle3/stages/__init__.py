"""The stages: the only code that reads the whole composed config and calls down into
training, evaluation, extraction, the target, the store and the draft. With them, what only
composition needs: Hydra's ConfigStore and resolvers (compose), checks across fields
(validate), the multirun callback (sweep). The planner (costs, time budget, disk) is
eagle3/planning/; each CLI's schema is eagle3/config/cli.py.

    extract.py     -> stages.extract.run
    train.py       -> stages.train.run
    evaluate.py    -> stages.evaluate.run
    export.py      -> stages.export.run
    python -m eagle3.stages.replay_export -> stages.replay_export.run
"""
