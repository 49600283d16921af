"""Reward-model training: preference losses (pure functions), preference-pair data, the Bradley–Terry trainer.

Heavy libraries (transformers, peft, datasets, accelerate) load inside functions, never at import time.
"""
