"""Performance: the scaling model (pure), measuring probes run as ranks, and ``ppmulti bench``."""
