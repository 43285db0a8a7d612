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


def pytest_sessionstart(session):
    # The C++ node hooks, built once per torch into the user's cache as the launcher builds them before a job's
    # ranks start (~20 s the first time): the in-process tests and every rank then register hooks through them.
    # A machine without a compiler keeps torch's Python API (tests/inject/test_nodehook.py is then skipped).
    from msprobe_inject import nodehook

    said = nodehook.build()
    if said:
        print(f"\nC++ node hooks: {said}")
