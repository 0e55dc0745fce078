from pathlib import Path

import pytest

from bigslide.data.table import SlideEntry, SlideTable
from bigslide.errors import DataError


@pytest.fixture
def slide_dir(tmp_path: Path) -> Path:
    (tmp_path / "s").mkdir()
    for name in "abcdefgh":
        (tmp_path / "s" / f"{name}.svs").write_bytes(b"x")
    (tmp_path / "r.geojson").write_text("{}")
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_reads_relative_paths_labels_splits_and_regions(slide_dir: Path) -> None:
    csv = write(
        slide_dir / "t.csv", "slide,label,split,regions\ns/a.svs,tumor,train,r.geojson\ns/b.svs,normal,val,\n"
    )
    table = SlideTable.from_csv(csv)
    assert [e.path for e in table.entries] == [slide_dir / "s/a.svs", slide_dir / "s/b.svs"]
    assert table.classes == ["normal", "tumor"]
    assert [table.encode(e.label) for e in table.entries] == [1, 0]
    assert table.entries[0].regions == slide_dir / "r.geojson"
    assert table.entries[1].regions is None
    assert [len(table.subset(s)) for s in ("train", "val", "test")] == [1, 1, 0]


def test_round_trip_writes_paths_relative_to_the_csv(slide_dir: Path) -> None:
    table = SlideTable([SlideEntry(slide_dir / "s/a.svs", "tumor", "train", slide_dir / "r.geojson")])
    out = table.to_csv(slide_dir / "out.csv")
    assert "s/a.svs,tumor,train,r.geojson" in out.read_text()
    assert SlideTable.from_csv(out).entries == table.entries


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("path,label\ns/a.svs,x\n", "missing column(s) slide for"),
        ("slide,label\ns/zz.svs,x\n", "row 2: slide file not found"),
        ("slide,label\ns/a.svs,x\ns/a.svs,y\n", "row 3: a.svs is listed twice (first at row 2)"),
        ("slide,label\ns/a.svs,\n", "row 2: empty label"),
        ("slide,label,split\ns/a.svs,x,training\n", "row 2: split 'training' is not one of"),
        ("slide,label,regions\ns/a.svs,x,missing.geojson\n", "row 2: regions file not found"),
        ("slide,label\n", "has no rows"),
    ],
)
def test_bad_rows_are_named(slide_dir: Path, text: str, message: str) -> None:
    csv = write(slide_dir / "bad.csv", text)
    with pytest.raises(DataError) as err:
        SlideTable.from_csv(csv)
    assert message in str(err.value)
    assert str(csv) in str(err.value)


def test_unknown_label_against_known_classes(slide_dir: Path) -> None:
    csv = write(slide_dir / "t.csv", "slide,label\ns/a.svs,tumour\n")
    with pytest.raises(DataError, match="row 2: unknown label 'tumour'"):
        SlideTable.from_csv(csv, classes=["normal", "tumor"])


def test_stratified_split_keeps_given_splits_and_balances_classes(slide_dir: Path) -> None:
    rows = ["slide,label,split"] + [
        f"s/{n}.svs,{'tumor' if i % 2 else 'normal'}," for i, n in enumerate("abcdefg")
    ]
    rows.append("s/h.svs,tumor,test")
    table = SlideTable.from_csv(write(slide_dir / "t.csv", "\n".join(rows) + "\n")).with_splits(
        val_fraction=0.5
    )
    assert table.entries[-1].split == "test"
    val = table.subset("val")
    assert len(val) == 4  # half of the 7 unsplit rows, rounded
    assert sorted(e.label for e in val.entries) == ["normal", "normal", "tumor", "tumor"]
    again = SlideTable.from_csv(slide_dir / "t.csv").with_splits(val_fraction=0.5)
    assert [e.split for e in again.entries] == [e.split for e in table.entries]


def test_prediction_tables_may_leave_labels_out(slide_dir: Path) -> None:
    no_column = SlideTable.from_csv(write(slide_dir / "a.csv", "slide\ns/a.svs\n"), labels_required=False)
    assert [e.label for e in no_column.entries] == [""]
    mixed = write(slide_dir / "b.csv", "slide,label\ns/a.svs,\ns/b.svs,tumor\n")
    table = SlideTable.from_csv(mixed, classes=["normal", "tumor"], labels_required=False)
    assert [e.label for e in table.entries] == ["", "tumor"]
    with pytest.raises(DataError, match="row 2: empty label"):
        SlideTable.from_csv(mixed)


def test_labels_differing_only_in_case_or_spaces_are_refused_with_their_rows(slide_dir: Path) -> None:
    csv = write(
        slide_dir / "t.csv", "slide,label\ns/a.svs,tumor\ns/b.svs,Tumor \ns/c.svs,normal\ns/d.svs,tumor\n"
    )
    with pytest.raises(DataError) as err:
        SlideTable.from_csv(csv)
    message = str(err.value)
    assert "'tumor' at row(s) 2, 5" in message
    assert "'Tumor' at row(s) 3" in message
    assert "upper/lower case" in message
    # typed in a panel (no rows): the slides are named
    with pytest.raises(DataError, match=r"'Tumor' at slide\(s\) b.svs"):
        SlideTable([SlideEntry(slide_dir / "s/a.svs", "tumor"), SlideEntry(slide_dir / "s/b.svs", "Tumor")])


@pytest.mark.parametrize("separator", [";", "\t"])
def test_a_spreadsheet_table_with_another_separator_is_read(slide_dir: Path, separator: str) -> None:
    rows = ["slide,label,split", "s/a.svs,tumor,train", "s/b.svs,normal,val"]
    csv = write(slide_dir / "t.csv", "\n".join(r.replace(",", separator) for r in rows) + "\n")
    table = SlideTable.from_csv(csv)
    assert [(e.path.name, e.label, e.split) for e in table.entries] == [
        ("a.svs", "tumor", "train"),
        ("b.svs", "normal", "val"),
    ]


def test_a_semicolon_table_reads_decimal_commas(slide_dir: Path) -> None:
    csv = write(slide_dir / "t.csv", "slide;time;event\ns/a.svs;12,5;1\ns/b.svs;3;0\n")
    table = SlideTable.from_csv(csv, task="survival")
    assert [(e.time, e.event) for e in table.entries] == [(12.5, 1), (3.0, 0)]


def test_numeric_labels_are_classes_in_their_order_and_one_number_is_one_class(slide_dir: Path) -> None:
    """Grades as text sorted 1, 10, 2: an ordinal metric (QWK) then read grade 10 as the lowest."""
    rows = [f"s/{n}.svs,{g}" for n, g in zip("abcd", ("10", "2", "1", "tumour"))]
    table = SlideTable.from_csv(write(slide_dir / "t.csv", "slide,label\n" + "\n".join(rows) + "\n"))
    assert table.classes == ["1", "2", "10", "tumour"]
    same = write(slide_dir / "u.csv", "slide,label\ns/a.svs,1\ns/b.svs,1.0\ns/c.svs,0\n")
    with pytest.raises(DataError, match=r"'1' at row\(s\) 2; '1\.0' at row\(s\) 3 differ only in .*number"):
        SlideTable.from_csv(same)


def test_column_names_are_read_whatever_their_case(slide_dir: Path) -> None:
    """A fixed split or a case column spelt "Split" or "CASE" was dropped without a word: the split was
    then drawn at random, and one patient's slides could land on both sides."""
    csv = write(slide_dir / "t.csv", "Slide,LABEL,Split,CASE,Patient ID\ns/a.svs,tumor,val,p1,7\n")
    table = SlideTable.from_csv(csv)
    assert [(e.path.name, e.label, e.split, e.case) for e in table.entries] == [
        ("a.svs", "tumor", "val", "p1")
    ]
    both = write(slide_dir / "u.csv", "slide,label,split,Split\ns/a.svs,tumor,val,train\n")
    with pytest.raises(DataError, match=r"u\.csv: columns 'split', 'Split' are one column \(split\)"):
        SlideTable.from_csv(both)


def test_a_pixel_size_column_is_read_and_written_back(slide_dir: Path) -> None:
    """Each row's µm/px (under any of its usual names), for files that state none; a magnification written
    there instead is named."""
    csv = write(slide_dir / "t.csv", "slide,label,MPP\ns/a.svs,tumor,0.25\ns/b.svs,normal,\n")
    table = SlideTable.from_csv(csv)
    assert [e.mpp for e in table.entries] == [0.25, None]
    again = SlideTable.from_csv(table.to_csv(slide_dir / "again.csv"))
    assert [e.mpp for e in again.entries] == [0.25, None]
    assert "mpp" in again.columns
    magnification = write(slide_dir / "m.csv", "slide,label,microns_per_pixel\ns/a.svs,tumor,40\n")
    with pytest.raises(
        DataError, match=r"m\.csv, row 2: mpp is the slide's µm per pixel .*0\.25 at 40x.*got 40"
    ):
        SlideTable.from_csv(magnification)
    words = write(slide_dir / "w.csv", "slide,label,mpp\ns/a.svs,tumor,40x\n")
    with pytest.raises(DataError, match=r"w\.csv, row 2: mpp must be a number, got '40x'"):
        SlideTable.from_csv(words)


def test_a_table_whose_columns_are_not_found_names_what_was_read(slide_dir: Path) -> None:
    csv = write(slide_dir / "t.csv", "slide|label\ns/a.svs|tumor\n")
    with pytest.raises(DataError) as err:
        SlideTable.from_csv(csv)
    assert "columns read, separated by commas: slide|label" in str(err.value)


def test_a_folder_given_as_a_table_is_named_not_a_crash(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=rf"{tmp_path}: cannot be read as a slide table \(Is a directory\)"):
        SlideTable.from_csv(tmp_path)


@pytest.mark.parametrize("encoding", ["utf-8-sig", "cp1252"])
def test_a_table_excel_saved_with_accented_paths_is_read(slide_dir: Path, encoding: str) -> None:
    """Excel saves CSV with a byte-order mark, or on Windows in the Western code page."""
    (slide_dir / "Données").mkdir()
    (slide_dir / "Données" / "lame_é1.svs").write_bytes(b"x")
    csv = slide_dir / "t.csv"
    csv.write_bytes("slide;label\r\nDonnées/lame_é1.svs;tumeur\r\ns/a.svs;sain\r\n".encode(encoding))
    table = SlideTable.from_csv(csv)
    assert [(e.path, e.label) for e in table.entries] == [
        (slide_dir / "Données" / "lame_é1.svs", "tumeur"),
        (slide_dir / "s" / "a.svs", "sain"),
    ]


def test_a_spreadsheet_workbook_given_as_a_table_is_named(slide_dir: Path) -> None:
    book = slide_dir / "slides.csv"
    book.write_bytes(b"PK\x03\x04\x14\x00\x06\x00\x08\x00\x00\x00!\x00" + bytes(64))
    with pytest.raises(
        DataError, match=r"slides\.csv: not a text CSV file \(a spreadsheet workbook\? save it as CSV\)"
    ):
        SlideTable.from_csv(book)


def test_a_case_labelled_in_two_spellings_is_said_as_a_spelling(slide_dir: Path) -> None:
    """'Tumor ' beside 'tumor' in one case was said as a case whose slides disagree, hiding the spelling."""
    csv = write(
        slide_dir / "t.csv", "slide,label,case\ns/a.svs,tumor,p1\ns/b.svs,Tumor ,p1\ns/c.svs,normal,p2\n"
    )
    with pytest.raises(DataError, match=r"'tumor' at row\(s\) 2; 'Tumor' at row\(s\) 3 differ only in"):
        SlideTable.from_csv(csv)
    at_odds = write(slide_dir / "u.csv", "slide,label,case\ns/a.svs,tumor,p1\ns/b.svs,normal,p1\n")
    with pytest.raises(DataError, match=r"u\.csv, row 3: case 'p1' has label normal here but label tumor"):
        SlideTable.from_csv(at_odds)


def test_prediction_takes_a_table_whose_case_lies_in_two_splits(slide_dir: Path) -> None:
    """Splits are training's: predicting another lab's table was refused for a case split across them."""
    text = "slide,label,case,split\ns/a.svs,tumor,p1,train\ns/b.svs,tumor,p1,test\ns/c.svs,normal,p2,val\n"
    csv = write(slide_dir / "t.csv", text)
    table = SlideTable.to_predict(csv, classes=["normal", "tumor"], task="classification")
    assert [e.case for e in table.entries] == ["p1", "p1", "p2"]
    with pytest.raises(DataError, match=r"t\.csv, row 3: case 'p1' is in split 'test' here but in 'train'"):
        SlideTable.from_csv(csv)


def test_a_table_written_on_windows_finds_its_slides_and_names_a_drive_path(slide_dir: Path) -> None:
    """Folders separated by backslashes, as a spreadsheet on Windows writes them, are the same folders here;
    a path on a Windows drive is named as such."""
    csv = write(slide_dir / "t.csv", "slide,label,regions\ns\\a.svs,tumor,\n")
    [entry] = SlideTable.from_csv(csv).entries
    assert entry.path == (slide_dir / "s" / "a.svs").resolve()
    drive = write(slide_dir / "d.csv", "slide,label\nD:\\scans\\a.svs,tumor\n")
    with pytest.raises(DataError, match=r"d\.csv, row 2: slide file not found: .*a Windows path, D:"):
        SlideTable.from_csv(drive)


def test_a_path_relative_to_the_working_folder_is_named_with_where_paths_are_read_from(
    slide_dir: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path_factory.mktemp("tables")
    csv = write(elsewhere / "t.csv", "slide,label\ns/a.svs,tumor\n")
    monkeypatch.chdir(slide_dir)  # where s/a.svs is, but not beside the table
    with pytest.raises(DataError, match=r"slide file not found: .*there is a s/a\.svs in the working folder"):
        SlideTable.from_csv(csv)
