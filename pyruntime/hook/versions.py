"""Version-range checks for patch targets.

A patch set declares the distribution it patches and a half-open version range
``[minimum, below)``. The installed version is read from the distribution metadata, so
the check never imports the target package.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class VersionRange:
    """The versions of one distribution a patch set was written and checked against.

    Args:
        distribution: the distribution name as installed, e.g. ``"vllm-ascend"``.
        minimum: the lowest supported version, inclusive (pre-releases of it count).
        below: the first unsupported version, exclusive.
    """

    distribution: str
    minimum: str
    below: str

    def check(self, installed: str | None) -> str | None:
        """Return ``None`` when ``installed`` is in range, else a one-sentence reason.

        ``installed`` is ``None`` when the distribution metadata is missing.
        """
        if installed is None:
            return f"{self.distribution} is not installed (no distribution metadata)"
        try:
            version = Version(installed)
        except InvalidVersion:
            return f"{self.distribution} reports an unparsable version {installed!r}"
        # Compare release numbers so that 0.23.0rc1 counts as part of the 0.23.0 line.
        low = Version(self.minimum).release
        high = Version(self.below).release
        if low <= version.release < high:
            return None
        return (
            f"{self.distribution} {installed} is outside the supported range "
            f">={self.minimum},<{self.below}"
        )

    def __str__(self) -> str:
        return f"{self.distribution}>={self.minimum},<{self.below}"


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or ``None`` when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
