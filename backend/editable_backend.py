"""The project's build backend: setuptools' own, with editable installs in setuptools' "compat" mode.

setuptools' default editable install finds the packages through an import hook that Python asks only after
every folder on the path: from a folder that holds a directory named `stylevar` (the clone itself, seen from
its parent), `import stylevar` then gives that directory as an empty namespace package ("cannot import name
'StylePipeline' from 'stylevar' (unknown location)"). The compat mode puts the repository root on the path
instead (a .pth file), so the real package, which has an __init__.py, wins wherever Python starts.
"""
from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 (every hook setuptools offers, build_editable replaced below)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    settings = {"editable_mode": "compat", **(config_settings or {})}
    return _setuptools.build_editable(wheel_directory, settings, metadata_directory)
