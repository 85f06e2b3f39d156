__version__ = "0.1.0"  # keep equal to pyproject.toml's version (a test checks)
