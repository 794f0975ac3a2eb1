"""The pure core: records, digests, seeds, divergence, verdicts and statistics.

Nothing here touches files, subprocesses or torch's global state, and nothing imports torch or
NumPy at module level: every function takes plain values and returns plain values.
"""
