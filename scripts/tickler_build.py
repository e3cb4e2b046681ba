"""tickler's build backend: setuptools' own, without one false alarm of its editable install.

An editable install of a package found under links (tickler/ links to the top-level folders)
makes setuptools warn that "folders in your working directory with the same name as your
package may take precedence during imports". Here that folder *is* the package, so the warning
tells a newcomer running `make serve` about a problem they do not have; it is silenced, and
only it. Everything else is setuptools.build_meta unchanged.
"""

from __future__ import annotations

import warnings
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 (the hooks pip calls: build_wheel, build_sdist, ...)


def build_editable(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"\s*Editable installation")
        return str(_setuptools.build_editable(wheel_directory, config_settings, metadata_directory))
