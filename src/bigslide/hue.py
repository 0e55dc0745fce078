"""Hue about the grey axis of RGB or optical-density (OD) vectors, in numpy alone (no torch), for the stain
augmentation and the synthetic labs alike."""

from __future__ import annotations

import math

import numpy as np

GREY = np.full(3, 1 / math.sqrt(3))
_FIRST = np.array([1.0, -1.0, 0.0]) / math.sqrt(2)
_SECOND = np.cross(GREY, _FIRST)
MIN_ABSORBANCE = 0.01  # of a turned stain's unit vector in any channel


def turn_about_grey(vector: np.ndarray, degrees: float) -> np.ndarray:
    """`vector` turned about the grey axis (1, 1, 1)/√3 by `degrees`: its hue turns, its length and grey
    component stay (Rodrigues' rotation)."""
    v = np.asarray(vector, np.float64)
    a = math.radians(degrees)
    return v * math.cos(a) + np.cross(GREY, v) * math.sin(a) + GREY * (GREY @ v) * (1 - math.cos(a))


def hue_angle(vector: np.ndarray) -> float:
    """The hue of `vector`: its angle about the grey axis in degrees, in `turn_about_grey`'s direction."""
    v = np.asarray(vector, np.float64)
    return math.degrees(math.atan2(float(v @ _SECOND), float(v @ _FIRST)))


def turned_stain(vector: np.ndarray, degrees: float) -> np.ndarray:
    """A stain's OD unit vector with its hue turned by `degrees`. A dye absorbs in every channel, never
    emits: where the turn would take a channel below `MIN_ABSORBANCE`, the vector is drawn towards grey
    (less pure) just enough, so the hue turns by exactly `degrees` (eosin, nearly a pure green absorber,
    turns by 30° only as a greyer dye)."""
    v = np.asarray(vector, np.float64)
    v = v / np.linalg.norm(v)
    turned = turn_about_grey(v, degrees)
    grey = GREY * (GREY @ turned)
    chroma = turned - grey
    floor = MIN_ABSORBANCE * np.linalg.norm(turned)
    low = chroma < 0
    if (turned < floor).any():
        keep = np.min((grey[low] - floor) / -chroma[low])
        turned = grey + max(0.0, keep) * chroma
    return turned / np.linalg.norm(turned)
