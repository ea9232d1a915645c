"""Lightning training of the draft head: data, module, logging, checkpoints, export."""
