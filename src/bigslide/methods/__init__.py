"""Training methods behind one protocol (see `base.Method`). Importing this package registers them."""

from bigslide.methods.base import (
    Batch,
    Method,
    MethodParams,
    ModelSpec,
    Prediction,
    Sample,
    Stepper,
    StepResult,
    available_methods,
    get_method,
    make_params,
    register,
)

__all__ = [
    "Batch",
    "Method",
    "MethodParams",
    "ModelSpec",
    "Prediction",
    "Sample",
    "StepResult",
    "Stepper",
    "available_methods",
    "get_method",
    "make_params",
    "register",
]

# Registering the built-in methods (each module's @register runs on import).
from bigslide.methods import abmil_acc, biglayer, full_image, mil_baselines, patchgd  # noqa: F401
