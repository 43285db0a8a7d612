"""Shared pytest configuration."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "e2e: end-to-end runs through the real launcher that need the in-rank runtime "
        "(msprobe_inject.zero_code); deselect with -m 'not e2e'",
    )
