"""A lent GPU machine's packages, on this one. Python runs this module as it starts when this folder is on
PYTHONPATH (:func:`tests.device_image.image_env` puts it there for a child process and its own children). Where
STYLEVAR_DEVICE_LISTS names package lists (scripts/device/image.txt, the image's, and the wheels a run carries), every
finder on ``sys.meta_path`` stops finding the packages installed here that no list names, so importing one fails
as on the lent machine (ModuleNotFoundError) and ``importlib.util.find_spec`` says None for it. It goes by top-level
name: one that a listed distribution shares with an unlisted one (a namespace such as ``google``) stays visible."""
from __future__ import annotations

import importlib.metadata
import os
import re
import sys

PROJECT = "stylevar"  # the repository's own distribution: it travels with every call


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def listed(path: str) -> set[str]:
    """The distribution names of a package list: one a line, with or without a version, ``#`` comments."""
    lines = (line.split("#", 1)[0].strip() for line in open(path, encoding="utf-8"))
    return {normalized(re.split(r"[=<>!~; \[]", line, maxsplit=1)[0]) for line in lines if line}


class Unlisted:
    """A finder that finds nothing of the ``hidden`` top-level packages and asks ``finder`` for everything else."""

    def __init__(self, finder, hidden: frozenset[str]):
        self.finder, self.hidden = finder, hidden

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.hidden or not hasattr(self.finder, "find_spec"):
            return None
        return self.finder.find_spec(fullname, path, target)

    def __getattr__(self, name):  # invalidate_caches, find_distributions: the wrapped finder's
        return getattr(self.finder, name)


def hide_unlisted(lists: list[str]) -> frozenset[str]:
    """Hide the top-level packages of every distribution installed here that none of ``lists`` names."""
    allowed = {PROJECT}.union(*(listed(path) for path in lists))
    hidden = frozenset(module for module, dists in importlib.metadata.packages_distributions().items()
                       if not any(normalized(d) in allowed for d in dists))
    sys.meta_path[:] = [Unlisted(finder, hidden) for finder in sys.meta_path]
    return hidden


if os.environ.get("STYLEVAR_DEVICE_LISTS"):
    hide_unlisted(os.environ["STYLEVAR_DEVICE_LISTS"].split(os.pathsep))
