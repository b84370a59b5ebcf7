"""Names of a package imported from its submodules on first use (PEP 562), so that importing the
package, or a light submodule of it (a command's options), loads none of the heavy ones."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def names(
    package: str,
    where: dict[str, str],
    namespace: dict[str, Any],
    before: Callable[[str], None] | None = None,
    submodules: tuple[str, ...] = (),
):
    """``__getattr__`` and ``__dir__`` for ``package`` (whose globals are ``namespace``): a name of
    ``where`` (name -> submodule) is imported from that submodule, after ``before(name)`` (which
    may raise, e.g. for a missing dependency), and kept; a name of ``submodules`` is that
    submodule, imported; other names are left to the import system (other submodules) or are an
    AttributeError."""

    def __getattr__(name: str):
        if name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        elif name in where:
            if before is not None:
                before(name)
            value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where) | set(submodules))

    return __getattr__, __dir__
