"""Test instruments, not product: start an emulator (emulator.py) or the real router (router.py)
on 127.0.0.1 for a test or a bench. The wheel leaves this package out (pyproject.toml), so no
image ships it; a source checkout (the tests, bench/ with src/ on its path) has it.
"""
