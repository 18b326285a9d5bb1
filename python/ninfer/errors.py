"""Typed errors. The C++ engine raises these same classes (its binding translates its own error types to them)."""


class NinferError(Exception):
    """Base of every error ninfer raises on purpose."""


class ArtifactError(NinferError):
    """A .ninfer file is unreadable, corrupt, of another version, or lacks what the model needs."""


class RecipeError(NinferError):
    """A conversion recipe is unknown or asks for something impossible (e.g. an unknown encoding)."""


class ConversionError(NinferError):
    """A source checkpoint cannot be converted."""


class UnsupportedArchitectureError(ConversionError):
    """The source model's architecture is not one ninfer runs."""


class EngineError(NinferError):
    """A request or option the engine refuses (bad token id, too-long prompt, invalid sampling value...)."""


class EngineBusyError(EngineError):
    """The engine's admission queue is full; retry later."""


class CapacityError(EngineError):
    """A request can never fit (prompt longer than max_context, reservation larger than the KV pool)."""


class OutOfMemoryError(EngineError):
    """Weights, caches or workspace do not fit in memory; the message carries the numbers."""


class MediaError(EngineError):
    """An image or video part of a request cannot be used: undecodable, truncated, empty, too large, of an
    unsupported format, or over a configured limit. `part` names the part (as the caller numbered it), `reason`
    says why in words a user can act on."""

    def __init__(self, part: str, reason: str) -> None:
        super().__init__(f"{part}: {reason}")
        self.part = part
        self.reason = reason
