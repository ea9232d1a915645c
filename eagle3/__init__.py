"""eagle3: train EAGLE-3 speculative-decoding draft heads for served LLMs."""

__version__ = "0.1.0"
