"""Exception types shared across rewardkit."""

from __future__ import annotations


class RewardkitError(Exception):
    """Base class of every error rewardkit raises on purpose."""


class RewardInputError(RewardkitError, ValueError):
    """An input cannot be scored. ``index`` names the offending sample (None for call-level problems)."""

    def __init__(self, message: str, index: int | None = None):
        self.index = index
        self.reason = message
        super().__init__(f"sample {index}: {message}" if index is not None else message)


class MissingDependencyError(RewardkitError, ImportError):
    """An optional dependency is not installed; the message carries the exact pip command."""

    def __init__(self, module: str, extra: str, purpose: str | None = None):
        self.module = module
        self.extra = extra
        what = f" (needed for {purpose})" if purpose else ""
        self.install_command = f"pip install 'rewardkit-vision[{extra}]'"
        super().__init__(f"'{module}' is not installed{what}. Install it with:\n    {self.install_command}")


class RegistryError(RewardkitError, KeyError):
    """Unknown reward name or two registry entries claiming one name."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it readable
        return str(self.args[0]) if self.args else ""


class ConfigError(RewardkitError, ValueError):
    """Invalid configuration: unknown keys, bad override syntax or a value of the wrong type."""


class UsageError(Exception):
    """A problem with the command line or its input files; the CLI prints the message and exits 2."""
