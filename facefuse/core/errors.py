"""The project's error types, in one place.

Every error a user can cause is an :class:`InvalidInput` naming the field and the
expectation; the Triton adapters map it once to ``TritonError.INVALID_ARG`` (HTTP 400,
gRPC INVALID_ARGUMENT). Anything else is a server fault (HTTP 500).
"""

from __future__ import annotations


class FacefuseError(Exception):
    """Base class of all facefuse errors."""


class InvalidInput(FacefuseError, ValueError):
    """A request field is wrong: ``field`` names it, the message says what was expected."""

    def __init__(self, field: str, expectation: str):
        self.field = field
        self.expectation = expectation
        super().__init__(f"{field}: {expectation}")


class NoFaceFound(InvalidInput):
    """No face was detected in the named image."""

    def __init__(self, field: str):
        super().__init__(field, "no face found in the image; send a photo with one visible face")


class Busy(FacefuseError):
    """A bounded resource is full (streams, frames in flight): the same request may succeed
    later. Served as UNAVAILABLE (HTTP 503 / gRPC UNAVAILABLE), which clients retry."""

    def __init__(self, what: str):
        super().__init__(f"busy, retry: {what}")


class ModelLoadError(FacefuseError, RuntimeError):
    """An artefact (ONNX file, engine, config) is missing or unusable at load time."""


# Prefix that BLS callers look for: inside BLS every callee error arrives as INTERNAL,
# so a callee marks user errors with this tag and the caller re-raises them as InvalidInput.
INVALID_TAG = "invalid input: "


def tag_invalid(message: str) -> str:
    """Return ``message`` marked as a user error for a BLS caller."""
    return message if message.startswith(INVALID_TAG) else INVALID_TAG + message


def untag_invalid(message: str) -> str | None:
    """Return the user-error message inside a tagged BLS error text, or None if untagged."""
    index = message.find(INVALID_TAG)
    if index < 0:
        return None
    return message[index + len(INVALID_TAG) :]
