"""The collectives' exceptions, below every module that raises them (settings agree on values
through a group's own all-gather or its store and raise the same mismatch error as the
collectives)."""

from __future__ import annotations


class CollectiveMismatchError(ValueError):
    """Ranks called a collective with arguments that do not fit together (raised on every rank)."""


class PeerError(RuntimeError):
    """Another rank of the group failed inside the same zipccl call.

    Raised, once the call's ranks have agreed on its outcome, on every rank whose own steps did
    not fail (the failing rank raises its own exception). ``failures``: group rank -> what that
    rank reported ("Type: message", truncated to 128 bytes).
    """

    def __init__(self, message: str, failures: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.failures = failures or {}
