"""The manifest reader (fedcore/manifest.py): a bad cell is named by file, row and column."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.errors import ConfigError
from fedcore.manifest import read_manifest


def test_read_manifest_names_file_row_and_column(tmp_path):
    path = tmp_path / "manifest.csv"
    path.write_text("client_id,sample_index,label\n0,3,1\n0,7,2\n")
    cid, idx, y = read_manifest(path, num_samples=8, labels=np.array([0, 0, 0, 1, 0, 0, 0, 2]))
    assert cid.tolist() == [0, 0] and idx.tolist() == [3, 7] and y.tolist() == [1, 2]
    with pytest.raises(ConfigError, match=r"row 3, column sample_index: 7 is out of range"):
        read_manifest(path, num_samples=7)
    path.write_text("client_id,sample_index,label\n0,3,1\n0,-7,2\n")
    with pytest.raises(ConfigError, match=r"row 3, column sample_index: '-7' is not an integer"):
        read_manifest(path)
    path.write_text("client_id,sample_index,label\n0,3\n")
    with pytest.raises(ConfigError, match=r"row 2 has 2 cells, expected 3"):
        read_manifest(path)


def test_a_binary_manifest_is_named_as_not_the_csv_partition_writes(tmp_path):
    """It said "cannot read the manifest (UnicodeDecodeError)" (the sweep of session 30)."""
    path = tmp_path / "manifest.csv"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match="not UTF-8 text, so not the CSV `fedapt partition` wr"):
        read_manifest(path)
