"""One way to build a reduced-precision (or re-targeted) engine from an FP32 export: a :class:`Recipe`.

A recipe names its engine and precision (:mod:`hllm.formats.vocabulary`), the scheme that builds it
(:data:`SCHEMES`, each a function of :mod:`hllm.calibration.recipes.builders`) and what the build needs
(the export's flavour, CPU features, calibration data). ``recipe.build(export, dst, calib)`` writes the
new export directory ``dst`` and returns its sidecar (:class:`hllm.formats.export.ExportMeta`).

``hllm calibrate`` (one recipe per ``--backend``; ``--backend auto``: the table of
:mod:`hllm.calibration.recipes.table`), ``hllm bench frontier`` (recipes of artefacts built before, with
their ``path``) and ``hllm debug precision`` (the ``nncf-int8`` recipe per variant) all build through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from hllm.errors import EngineError, HllmError
from hllm.formats.precision import Precision
from hllm.formats.vocabulary import QUANT_PRECISIONS, RECIPE_ENGINES, RECIPE_PRECISIONS

#: Schemes a recipe is built by (:data:`hllm.calibration.recipes.builders.BUILDERS` maps each to its function).
SCHEMES = ("export", "ort-static", "ort-dynamic", "ort-weight-only", "modelopt", "nncf-int8", "nncf-accuracy-control",
           "openvino-fp32", "openvino-bf16-hint", "openvino-bf16-islands", "fused-fp32", "openvino-int8-weights",
           "openvino-mixed-int8-mlp", "openvino-int8-sensitivity")


@dataclass
class RecipeInputs:
    """What a build may use besides the export (each scheme reads its own; all optional).

    Attributes:
        calibration: a :class:`hllm.formats.calibration_set.CalibrationSet` (ort-static, modelopt, NNCF).
        options: :class:`hllm.calibration.recipes.options.QuantOptions` of the ONNX Runtime / ModelOpt schemes
            (None = the scheme's defaults). cache_path: ORT's calibration-range cache (ort-static).
        validation / thresholds / ac_settings: the validation slates of NNCF's accuracy control and of the
            INT8 sensitivity search (never gate slates), the gate thresholds their floor comes from, and
            overrides of their settings.
        bf16_islands: the islands file of ``hllm debug precision --precision bf16`` (None = the defaults).
        feeds / keep_float / smooth_quant_alpha: ``nncf-int8``: calibration feed dicts, parts kept fp32,
            SmoothQuant's alpha (None = NNCF's default); ``keep_float`` of ``openvino-mixed-int8-mlp``: parts
            kept out of INT8 (then bf16 or fp32 as the recipe's ``float_precision``).
    """

    calibration: object = None
    options: object = None
    cache_path: Path | None = None
    validation: Sequence[dict] = ()
    thresholds: object = None
    ac_settings: dict | None = None
    bf16_islands: Path | None = None
    feeds: list | None = None
    keep_float: tuple[str, ...] = ()
    smooth_quant_alpha: float | None = None


@dataclass(frozen=True)
class Recipe:
    """One engine × precision and how to build it.

    Attributes:
        name: unique in its list (a record key of the selection report, a row of the frontier table).
        engine: one of :data:`hllm.formats.vocabulary.RECIPE_ENGINES`.
        precision: the dtype of its matrix products (:data:`~hllm.formats.vocabulary.RECIPE_PRECISIONS` or
            a quantizer's :data:`~hllm.formats.vocabulary.QUANT_PRECISIONS`; a string is parsed).
        scheme: one of :data:`SCHEMES`; None for an artefact built elsewhere (a ``bench frontier`` contender).
        path: the artefact it runs once built (export directory, ``.onnx`` or checkpoint); None until then.
        inference_precision: OpenVINO's ``INFERENCE_PRECISION_HINT`` (``f32`` / ``bf16``); None = default.
        flavour: the export flavour it is built from (``standard`` / ``ort-cpu``; None = any).
        isa: CPU features of which at least one must be present (:func:`hllm.measure.cpu_flags` names).
        isa_absent: CPU features none of which may be present: the variant for CPUs without them (e.g. fp32
            where its twin runs bf16), refused where the twin runs.
        needs_calibration: built from calibration data.
        settings: the scheme's own settings (e.g. ``mode`` and ``group_size`` of ``openvino-int8-weights``,
            ``float_precision`` of the mixed and search schemes).
        gate: gate figures measured elsewhere (``bench frontier --gates``: a ``GateReport.to_dict``).
    Raises: HllmError naming an unknown engine, precision or scheme.
    """

    name: str
    engine: str
    precision: Precision
    scheme: str | None = None
    path: str | None = None
    inference_precision: str | None = None
    flavour: str | None = None
    isa: tuple[str, ...] = ()
    isa_absent: tuple[str, ...] = ()
    needs_calibration: bool = False
    settings: dict = field(default_factory=dict, compare=False)
    gate: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.engine not in RECIPE_ENGINES:
            raise HllmError(f"recipe {self.name}: unknown engine {self.engine!r}; one of {list(RECIPE_ENGINES)}")
        p = Precision.parse(self.precision, f"recipe {self.name}")
        if p not in RECIPE_PRECISIONS + QUANT_PRECISIONS:
            raise HllmError(f"recipe {self.name}: precision {p} is not one of {[str(x) for x in RECIPE_PRECISIONS]}")
        if self.scheme is not None and self.scheme not in SCHEMES:
            raise HllmError(f"recipe {self.name}: unknown scheme {self.scheme!r}; one of {list(SCHEMES)}")
        object.__setattr__(self, "precision", p)

    def build(self, export, dst, calib: RecipeInputs | None = None):
        """Write this recipe of the FP32 export ``export`` into the new directory ``dst``.

        Returns: the new export's :class:`hllm.formats.export.ExportMeta` (read back and verified).
        Raises: EngineError for a recipe without a scheme, and what its builder raises (EngineError,
            NothingToQuantize, SlateError, ExportError).
        """
        from hllm.calibration.recipes.builders import BUILDERS
        from hllm.formats.export import read_export

        if self.scheme is None:
            raise EngineError(f"recipe {self.name} is an artefact built elsewhere ({self.path}): nothing to build")
        BUILDERS[self.scheme](self, Path(export), Path(dst), calib or RecipeInputs())
        return read_export(dst)

    def refusal(self, flavour: str, features: Sequence[str], has_calibration: bool,
                openvino_installed: bool) -> str | None:
        """Why this recipe cannot be built here (None = it can): the export's flavour, the CPU's instruction
        sets (``features`` as :func:`hllm.measure.cpu_flags` names them), missing calibration data or OpenVINO."""
        if self.flavour is not None and flavour != self.flavour:
            return (f"needs an export of flavour {self.flavour} (this one is {flavour}; "
                    f"`hllm export --flavour {self.flavour}`)")
        if self.isa and not set(self.isa) & set(features):
            return (f"this CPU lacks {' and '.join(i.upper() for i in self.isa)} "
                    f"(CPU features: {', '.join(features) or 'unknown'})")
        if set(self.isa_absent) & set(features):
            return (f"this CPU has {' / '.join(i.upper() for i in sorted(set(self.isa_absent) & set(features)))}: "
                    "this variant is for CPUs without it (its twin uses it)")
        if self.engine == "openvino" and not openvino_installed:
            return "OpenVINO is not installed (pip install 'hllm[openvino]')"
        if self.needs_calibration and not has_calibration:
            return "needs calibration data (--calib-slates or --calibration)"
        return None


def recipe_for_options(options) -> Recipe:
    """The recipe of one ``hllm calibrate --backend B`` run: scheme ``B`` (an ONNX Runtime or ModelOpt
    quantizer) with ``options`` (:class:`hllm.calibration.recipes.options.QuantOptions`) as its settings."""
    return Recipe(options.backend, "onnxruntime", options.precision, scheme=options.backend,
                  needs_calibration=options.backend not in ("ort-dynamic", "ort-weight-only"))
