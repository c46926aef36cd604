"""The one error every kernel raises for what it does not serve (jaxnorm re-exports it)."""


class Unsupported(NotImplementedError):
    """A kernel cannot serve this call (shape, dtype, config or device); the message says why."""
