"""The training run around ppdet's parts: build, loop, evaluate, checkpoint, resume."""
