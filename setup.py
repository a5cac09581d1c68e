"""Build script. Everything is declared in setup.cfg; this file only refuses an unsupported Python by name.

pip checks setup.cfg's ``python_requires`` itself and names the Python it refuses, but older pips (23.0, which
Python 3.10's venv brings) skip the check for a local project and would install keras_dyndp anyway.
"""

import configparser
import os
import platform
import sys

import setuptools
from packaging import specifiers

_config = configparser.ConfigParser()
_config.read(os.path.join(os.path.dirname(os.path.abspath(__file__)), "setup.cfg"))
_python_requires = _config["options"]["python_requires"]
if platform.python_version() not in specifiers.SpecifierSet(_python_requires):
    sys.exit(
        f"keras_dyndp requires Python {_python_requires}; this is Python {platform.python_version()} "
        f"({sys.executable}). See README.md, 'Supported stacks'."
    )

setuptools.setup()
