"""Compiled Paddle operators ppmulti adds (built on first use, cached per Paddle version)."""
