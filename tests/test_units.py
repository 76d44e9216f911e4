from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomguard.errors import UsageError
from oomguard.units import GiB, KiB, MiB, TiB, format_size, format_size_precise, parse_size, parse_size_or_percent


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0", 0),
        ("123", 123),
        ("123B", 123),
        ("1KiB", KiB),
        ("1k", KiB),
        ("1K", KiB),
        ("512M", 512 * MiB),
        ("512MiB", 512 * MiB),
        ("8G", 8 * GiB),
        ("8 GiB", 8 * GiB),
        ("1.5GiB", 3 * GiB // 2),
        ("0.1GiB", GiB // 10),
        ("2T", 2 * TiB),
        ("4GB", 4_000_000_000),
        ("4gb", 4_000_000_000),
        ("1KB", 1000),
        ("1MB", 1_000_000),
        ("1TB", 10**12),
        ("  332GiB\n", 332 * GiB),
        ("1_000", 1000),
    ],
)
def test_parse_size(text: str, want: int) -> None:
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["", "GiB", "-G", "1.2.3G", "1X", "1 GiBs", "abc", ".", "1e9", "nan", "１G"])
def test_parse_size_rejects_and_names_the_flag(text: str) -> None:
    with pytest.raises(UsageError, match=r"^--budget: invalid size"):
        parse_size(text, "--budget")


@pytest.mark.parametrize("text", ["-1G", "-5GiB", " -0.5 MiB", "-1"])
def test_negative_size_says_negative(text: str) -> None:
    with pytest.raises(UsageError, match=rf"^--budget: {text.strip()} is negative \(a size is 0 or more\)$"):
        parse_size(text, "--budget")


def test_percent() -> None:
    assert parse_size_or_percent("80%", "--budget") == (None, 80.0)
    assert parse_size_or_percent("2GiB", "--budget") == (2 * GiB, None)
    for bad in ("101%", "-5%", "%", "x%", "nan%"):
        with pytest.raises(UsageError, match="--margin: invalid percentage"):
            parse_size_or_percent(bad, "--margin")


@pytest.mark.parametrize(
    ("n", "want"),
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (KiB, "1 KiB"),
        (3 * GiB // 2, "1.5 GiB"),
        (342 * GiB, "342 GiB"),
        (8 * MiB, "8 MiB"),
        (5 * GiB // 4, "1.25 GiB"),
        (25276510208, "23.54 GiB"),
        (-2 * GiB, "-2 GiB"),
    ],
)
def test_format_size(n: int | None, want: str) -> None:
    assert format_size(n) == want


@given(st.text())
def test_parse_size_never_raises_anything_but_usage_error(text: str) -> None:
    try:
        assert parse_size(text, "--x") >= 0
    except UsageError as exc:
        assert str(exc).startswith("--x: ")


@given(st.integers(min_value=0, max_value=2**62))
def test_format_then_parse_is_close(n: int) -> None:
    # Printed sizes round to two decimals: parsing the text back lands within 1%.
    back = parse_size(format_size(n).replace(" ", ""))
    assert abs(back - n) <= max(1, n) * 0.01


@pytest.mark.parametrize(
    ("n", "shown"),
    [
        (64 * MiB - 1, "64 MiB (67108863 bytes)"),
        (64 * MiB, "64 MiB"),
        (1536 * MiB, "1.5 GiB"),
        (24_000_000_000, "22.35 GiB (24000000000 bytes)"),
        (0, "0 B"),
        (None, "-"),
    ],
)
def test_format_size_precise_shows_bytes_only_where_rounding_hides_them(n: int | None, shown: str) -> None:
    assert format_size_precise(n) == shown
