"""The stages: the only code that reads the whole composed config and calls down into
training, evaluation, extraction, the target, the store and the model.

    extract.py              -> stages.extract.run
    train.py                -> stages.train.run
    python -m eagle3.evaluate -> stages.evaluate.run
    python -m eagle3.export   -> stages.export.run
"""
