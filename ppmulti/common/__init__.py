"""Shared leaves: environment names, errors, /proc readers, atomic files, paths, YAML, train flags, fitness; they import neither side."""
