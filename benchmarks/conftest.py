"""Collect benchmarks/bench_*.py as test modules.

pytest's default python_files pattern (test_*.py) comes from the root
configuration and cannot be changed for one directory, so this hook collects
the bench_ files when pytest is pointed at benchmarks/:

    pytest benchmarks/ --benchmark-only

A plain `pytest` at the repository root never gets here (testpaths = tests).
"""

import pytest


def pytest_collect_file(file_path, parent):
    if file_path.suffix != ".py" or not file_path.name.startswith("bench_"):
        return None
    # A file named on the command line is collected by pytest itself already.
    if parent.session.isinitpath(file_path):
        return None
    return pytest.Module.from_parent(parent, path=file_path)
