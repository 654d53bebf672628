"""tf_otel's version, in a leaf module so the runtime reads it without importing the package root.

Usage::

    from tf_otel.version import __version__
"""

__version__ = "0.1.0"  # = [project] version in pyproject.toml (tests/test_architecture.py)
