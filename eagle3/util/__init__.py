"""The ground floor: helpers with no knowledge of configs, models or data (atomic files,
locks, hashing, fault injection, dtype names, launch facts, W&B mode, time and log lines)."""
