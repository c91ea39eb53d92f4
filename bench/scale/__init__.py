"""``python -m bench.scale``: the real supervisor actor driven by the rank emulator."""
