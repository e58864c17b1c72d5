"""The package's version. Its source is include/moejit.h (MJ_VERSION_MAJOR / MINOR / PATCH);
it is repeated here because the package is installed apart from the header. pyproject.toml
reads it from here, and tests/python/test_lib.py fails when it is not the header's."""
__version__ = "0.1.0"
