"""Shared pytest setup: make the repository root importable (`import model`, `import attention`)
however pytest is started. pytest.ini's `pythonpath = .` does the same when run from the root."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
