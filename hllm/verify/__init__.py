"""Verifiers: parity (backend vs PyTorch reference), the ranking-fidelity gate of reduced-precision
graphs, ranking-quality metrics and scoring (evaluation over slates and training caches is
:mod:`hllm.training.eval`, a layer above). Results are typed (dataclasses with ``to_dict`` and
``__bool__`` = passed), Polygraphy-comparator style: they say by how much a criterion failed."""
