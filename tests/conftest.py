"""Shared pytest setup: absl flags are marked parsed, since pytest does not parse them (examples read FLAGS)."""

from absl import flags


def pytest_configure(config):
    del config  # Unused.
    flags.FLAGS.mark_as_parsed()
