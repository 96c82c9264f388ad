"""Contract tests load the fixtures beside them; the filter plugins come from tests/conftest.py."""
