"""Training (paper §3.3-§4): log-domain Sinkhorn loss, click/teacher targets, the training loop.

Modules: :mod:`.sinkhorn` (operator + loss), :mod:`.targets` (target matrices), :mod:`.config`
(:class:`TrainConfig`), :mod:`.data` (slates, targets, the trained part's inputs), :mod:`.state`
(pickle-free training state), :mod:`.features` (hidden-state caches), :mod:`.trainer`
(``train(TrainConfig)``), :mod:`.choices` (the objectives and teacher aggregations the CLI offers),
:mod:`.eval` (rankers evaluated over slates). Imports torch; never imported by :mod:`hllm.runtime`.
"""
