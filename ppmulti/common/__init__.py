"""Shared leaves: imported by both sides (process and rank), importing neither.

Environment names, errors, /proc readers, atomic files, paths, YAML, train flags, fitness.
"""
