"""extract.py's stage: chat data -> target forward -> checked records -> sharded dataset."""
