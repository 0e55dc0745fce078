"""Write DICOM whole-slide images (VL Whole Slide Microscopy Image series) with pydicom and Pillow.

One file per pyramid level, as scanners and archives (e.g. NCI Imaging Data Commons) deliver them: each
level is an instance of one series, tiled full (every tile stored, row by row), with JPEG baseline frames
and its pixel spacing (mm) in the shared functional groups. Level 0 is ORIGINAL, the others DERIVED /
RESAMPLED. This is what OpenSlide 4 reads; the tests and docs use it to make DICOM slides from the
synthetic H&E tissue. pydicom comes with `bigslide[dev]`.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from bigslide.synthetic.pyramid import downsample_pyramid
from bigslide.synthetic.slides import LesionKind, SlideInfo, synthesize_slide

if TYPE_CHECKING:
    from pydicom.dataset import Dataset
    from pydicom.uid import UID

WSI_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.77.1.6"
"""VL Whole Slide Microscopy Image Storage."""
JPEG_BASELINE = "1.2.840.10008.1.2.4.50"
_BACKGROUND = 255  # padding of edge tiles: glass


def write_dicom_pyramid(
    folder: str | Path,
    levels: Sequence[np.ndarray],
    *,
    mpp: float = 0.5,
    tile: int = 256,
    quality: int = 90,
    seed: int = 0,
) -> list[Path]:
    """Write `levels` (level 0 first, (h, w, 3) uint8, each smaller) as one DICOM WSI series in `folder`,
    `level_<k>.dcm` per level; `mpp` is level 0's µm/px. UIDs derive from `seed` (same seed, same UIDs).

    Returns the files, level 0 first.
    """
    try:
        import pydicom  # noqa: F401
    except ImportError:
        raise ImportError("writing DICOM slides needs pydicom (pip install 'bigslide[dev]')") from None
    if not levels:
        raise ValueError("no levels to write")
    if mpp <= 0 or tile <= 0 or tile % 16:
        raise ValueError(f"need mpp > 0 and a tile size that is a positive multiple of 16 ({mpp=}, {tile=})")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    uids = _SeriesUids(seed)
    h0, w0 = levels[0].shape[:2]
    paths = []
    for index, level in enumerate(levels):
        path = folder / f"level_{index}.dcm"
        dataset = _level_dataset(level, index, uids, mpp=mpp, size0=(w0, h0), tile=tile)
        dataset.PixelData = _encapsulated_tiles(level, tile, quality)
        dataset["PixelData"].VR = "OB"
        partial = path.with_name(path.name + ".partial")
        dataset.save_as(partial, enforce_file_format=True)
        partial.replace(path)  # a crash never leaves a half-written level that OpenSlide would pick up
        paths.append(path)
    return paths


def make_dicom_slide(
    folder: str | Path,
    *,
    size: tuple[int, int] = (2048, 2048),
    lesions: int,
    seed: int,
    mpp: float = 0.5,
    tile: int = 256,
    n_levels: int = 3,
    lesion_kind: LesionKind = "tumour",
) -> SlideInfo:
    """A synthetic H&E slide (as `make_synthetic_slide`) written as a DICOM WSI series in `folder`.

    `SlideInfo.path` is the folder: bigslide opens a DICOM series from its folder or any of its files.
    """
    image = synthesize_slide(size, lesions=lesions, seed=seed, lesion_kind=lesion_kind)
    folder = Path(folder)
    write_dicom_pyramid(folder, downsample_pyramid(image.rgb, n_levels), mpp=mpp, tile=tile, seed=seed)
    return SlideInfo(
        path=folder,
        label=int(bool(image.lesions)),
        lesions=image.lesions,
        mpp=mpp,
        dimensions=(int(size[0]), int(size[1])),
    )


class _SeriesUids:
    """Deterministic UIDs of one series: study, series and frame of reference shared by every level."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.study = self.make("study")
        self.series = self.make("series")
        self.frame_of_reference = self.make("frame-of-reference")
        self.dimension_organization = self.make("dimension-organization")

    def make(self, what: str) -> UID:
        from pydicom.uid import generate_uid

        return generate_uid(entropy_srcs=["bigslide-synthetic", str(self.seed), what])


def _level_dataset(
    level: np.ndarray, index: int, uids: _SeriesUids, *, mpp: float, size0: tuple[int, int], tile: int
) -> Dataset:
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.sequence import Sequence as DicomSequence
    from pydicom.uid import PYDICOM_IMPLEMENTATION_UID, UID

    height, width = level.shape[:2]
    w0, h0 = size0
    # spacing of this level in mm: level 0's, times how much smaller this level is along each axis
    spacing_col = mpp / 1000 * w0 / width
    spacing_row = mpp / 1000 * h0 / height
    instance = uids.make(f"instance-{index}")

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = UID(WSI_SOP_CLASS)
    meta.MediaStorageSOPInstanceUID = instance
    meta.TransferSyntaxUID = UID(JPEG_BASELINE)
    meta.ImplementationClassUID = PYDICOM_IMPLEMENTATION_UID

    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = WSI_SOP_CLASS
    ds.SOPInstanceUID = instance
    ds.StudyInstanceUID = uids.study
    ds.SeriesInstanceUID = uids.series
    ds.FrameOfReferenceUID = uids.frame_of_reference
    ds.PositionReferenceIndicator = "SLIDE_CORNER"
    ds.Modality = "SM"
    ds.PatientName = "Synthetic^Slide"
    ds.PatientID = f"synthetic-{uids.seed}"
    ds.PatientBirthDate = ""
    ds.PatientSex = ""
    ds.StudyID = "1"
    ds.StudyDate = ds.SeriesDate = ds.ContentDate = "20250101"
    ds.StudyTime = ds.SeriesTime = ds.ContentTime = "000000"
    ds.AcquisitionDateTime = "20250101000000"
    ds.AccessionNumber = ""
    ds.ReferringPhysicianName = ""
    ds.SeriesNumber = 1
    ds.InstanceNumber = index + 1
    ds.Manufacturer = "bigslide"
    ds.ManufacturerModelName = "synthetic H&E"
    ds.DeviceSerialNumber = "0"
    ds.SoftwareVersions = "bigslide"
    ds.ContainerIdentifier = f"synthetic-{uids.seed}"
    ds.IssuerOfTheContainerIdentifierSequence = DicomSequence([])
    ds.ContainerTypeCodeSequence = DicomSequence([_code("433466003", "SCT", "Microscope slide")])
    specimen = Dataset()
    specimen.SpecimenIdentifier = f"synthetic-{uids.seed}"
    specimen.SpecimenUID = uids.make("specimen")
    specimen.IssuerOfTheSpecimenIdentifierSequence = DicomSequence([])
    specimen.SpecimenPreparationSequence = DicomSequence([])
    ds.SpecimenDescriptionSequence = DicomSequence([specimen])
    ds.AcquisitionContextSequence = DicomSequence([])

    # level 0 is the scan; the others are resampled from it
    ds.ImageType = ["ORIGINAL", "PRIMARY", "VOLUME", "NONE"] if index == 0 else [
        "DERIVED", "PRIMARY", "VOLUME", "RESAMPLED"
    ]  # fmt: skip
    ds.VolumetricProperties = "VOLUME"
    ds.BurnedInAnnotation = "NO"
    ds.SpecimenLabelInImage = "NO"
    ds.FocusMethod = "AUTO"
    ds.ExtendedDepthOfField = "NO"
    ds.LossyImageCompression = "01"
    ds.LossyImageCompressionMethod = "ISO_10918_1"

    ds.SamplesPerPixel = 3
    ds.PhotometricInterpretation = "YBR_FULL_422"
    ds.PlanarConfiguration = 0
    ds.BitsAllocated = 8
    ds.BitsStored = 8
    ds.HighBit = 7
    ds.PixelRepresentation = 0
    ds.Rows = ds.Columns = tile
    ds.NumberOfFrames = -(-height // tile) * -(-width // tile)
    ds.TotalPixelMatrixColumns = width
    ds.TotalPixelMatrixRows = height
    ds.TotalPixelMatrixFocalPlanes = 1
    ds.DimensionOrganizationType = "TILED_FULL"
    organization = Dataset()
    organization.DimensionOrganizationUID = uids.dimension_organization
    ds.DimensionOrganizationSequence = DicomSequence([organization])
    ds.ImagedVolumeWidth = w0 * mpp / 1000  # mm, the same for every level
    ds.ImagedVolumeHeight = h0 * mpp / 1000
    ds.ImagedVolumeDepth = 0.001
    ds.ImageOrientationSlide = [0, -1, 0, -1, 0, 0]  # rows run along the slide's short side, as scanned
    origin = Dataset()
    origin.XOffsetInSlideCoordinateSystem = 20.0
    origin.YOffsetInSlideCoordinateSystem = 40.0
    ds.TotalPixelMatrixOriginSequence = DicomSequence([origin])

    measures = Dataset()
    measures.PixelSpacing = [_ds(spacing_row), _ds(spacing_col)]  # row spacing first, in mm
    measures.SliceThickness = 0.001
    frame_type = Dataset()
    frame_type.FrameType = list(ds.ImageType)
    optical_path_id = Dataset()
    optical_path_id.OpticalPathIdentifier = "1"
    shared = Dataset()
    shared.PixelMeasuresSequence = DicomSequence([measures])
    shared.WholeSlideMicroscopyImageFrameTypeSequence = DicomSequence([frame_type])
    shared.OpticalPathIdentificationSequence = DicomSequence([optical_path_id])
    ds.SharedFunctionalGroupsSequence = DicomSequence([shared])

    optical_path = Dataset()
    optical_path.OpticalPathIdentifier = "1"
    brightfield = _code("111744", "DCM", "Brightfield illumination")
    optical_path.IlluminationTypeCodeSequence = DicomSequence([brightfield])
    optical_path.IlluminationColorCodeSequence = DicomSequence([_code("414298005", "SCT", "Full Spectrum")])
    ds.NumberOfOpticalPaths = 1
    ds.OpticalPathSequence = DicomSequence([optical_path])
    return ds


def _code(value: str, scheme: str, meaning: str) -> Dataset:
    from pydicom.dataset import Dataset

    code = Dataset()
    code.CodeValue = value
    code.CodingSchemeDesignator = scheme
    code.CodeMeaning = meaning
    return code


def _ds(value: float) -> str:
    """A decimal string (at most 16 characters, as DICOM's DS allows) that reads back as `value`."""
    text = repr(float(value))
    return text if len(text) <= 16 else f"{value:.10g}"


def _encapsulated_tiles(level: np.ndarray, tile: int, quality: int) -> bytes:
    """JPEG baseline tiles, row by row (TILED_FULL order), each one frame, with a basic offset table."""
    from pydicom.encaps import encapsulate

    height, width = level.shape[:2]
    frames = []
    for top in range(0, height, tile):
        for left in range(0, width, tile):
            block = np.full((tile, tile, 3), _BACKGROUND, np.uint8)
            part = level[top : top + tile, left : left + tile, :3]
            block[: part.shape[0], : part.shape[1]] = part
            buffer = io.BytesIO()
            # 4:2:2 chroma subsampling, as the YBR_FULL_422 photometric interpretation states
            Image.fromarray(block).save(buffer, "JPEG", quality=quality, subsampling="4:2:2")
            frames.append(buffer.getvalue())
    return encapsulate(frames, has_bot=True)
