"""ppmulti's version, and the line `ppmulti --version` prints (read from package metadata, nothing imported)."""

__version__ = "0.1.0"


def version_line() -> str:
    """What `ppmulti --version` prints: ppmulti's version, then Python's, Paddle's and ppdet's from package metadata
    (nothing is imported, so it answers at once and even where Paddle is broken)."""
    import sys
    from importlib import metadata

    parts = [f"Python {sys.version.split()[0]}"]
    for dist in ("paddlepaddle", "paddlepaddle-gpu", "paddledet"):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    if not any(p.startswith("paddlepaddle") for p in parts):
        parts.append("no Paddle installed")
    return f"ppmulti {__version__} ({', '.join(parts)})"
