"""Selection: build recipes, gate them against the FP32 reference and keep what passes (``hllm calibrate``:
one recipe in :mod:`.pipeline`, ``--backend auto``: the fastest that passes in :mod:`.select`)."""
