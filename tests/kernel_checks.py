"""Shared by the kernel tests: the interpreter's race verdict."""

from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call


def assert_race_free() -> None:
    """The Pallas GPU interpreter's vector-clock detector saw no race in the last runs."""
    assert interpret_pallas_call.get_races().races_found is False
