"""The corpus error and document type, shared by `workers.data` and `workers.data_records`."""

from __future__ import annotations

from typing import Any, NamedTuple


class CorpusError(ValueError):
    """An unusable corpus or corpus request. `field` names the offending input, `reason` why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickling rebuilds an exception from `args` (the message alone), which this
        # __init__ cannot take: Ray would deliver an "UnserializableException" instead.
        return (type(self), (self.field, self.reason))


class Document(NamedTuple):
    """One unit of the split: `doc_id` (a relative POSIX path or chunk index) and its bytes."""

    doc_id: str
    data: bytes
