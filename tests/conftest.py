"""Shared pytest configuration."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "e2e: end-to-end runs through the real launcher that need the in-rank runtime "
        "(msprobe_inject.zero_code); deselect with -m 'not e2e'",
    )
    config.addinivalue_line(
        "markers",
        "json_only: a reader test about the JSON files themselves, not run again through the dump's index",
    )
