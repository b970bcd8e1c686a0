"""The optional `tools` extra: matplotlib for the plots of `attn2d demo` and `attn2d bench`, Pillow
for `attn2d train-gan`'s images. The attention itself needs neither, so they are imported only
where used, and a missing one is named with the command that installs it."""

from __future__ import annotations

import importlib.util

INSTALL = "pip install attn2d[tools]"

# import name -> the distribution that provides it
PACKAGES = {"matplotlib": "matplotlib", "PIL": "pillow"}


class MissingToolError(ImportError):
    """An optional package of the `tools` extra is not installed."""


def missing(*modules: str) -> list[str]:
    """The distributions of `modules` (import names) that cannot be imported here."""
    return [PACKAGES.get(m, m) for m in modules if importlib.util.find_spec(m) is None]


def require(what: str, *modules: str) -> None:
    """Raise MissingToolError, naming `pip install attn2d[tools]`, where any of `modules` (import
    names) is not installed; `what` names what needs them."""
    absent = missing(*modules)
    if absent:
        raise MissingToolError(f"{what} needs {' and '.join(absent)}, not installed here: "
                               f"{INSTALL}")
