"""A tracking URI MLflow cannot open is a UsageError before anything is written or run: checked
here without MLflow making a folder or retrying."""

import os

import pytest

from twice.core.errors import CorruptRecord, UsageError
from twice.integrations.mlflow_store import check_tracking_uri, mlflow_failure


@pytest.mark.parametrize(
    "uri, message",
    [
        ("nonsense://x", "MLflow cannot use the tracking URI 'nonsense://x'"),
        ("sqlite:///{tmp}/absent/m.db", "its folder {tmp}/absent does not exist"),
        ("sqlite:///{tmp}", "is a folder, not a database file"),
        ("sqlite:///{tmp}/train.py", "is not an SQLite database"),
    ],
)
def test_a_store_that_cannot_be_opened_is_refused_naming_why(tmp_path, uri, message):
    (tmp_path / "train.py").write_text("print('not a database')\n")
    uri, message = uri.format(tmp=tmp_path), message.format(tmp=tmp_path)
    with pytest.raises(UsageError) as refused:
        check_tracking_uri(uri)
    assert message in refused.value.message and refused.value.hint
    assert not (tmp_path / "absent").exists()  # MLflow would have made the folder


def test_what_mlflow_can_open_passes(tmp_path):
    (tmp_path / "m.db").write_bytes(b"SQLite format 3\x00" + bytes(100))
    for uri in (
        None,
        f"sqlite:///{tmp_path}/m.db",
        f"sqlite:///{tmp_path}/new.db",
        "http://127.0.0.1:5000",
        "databricks",
        str(tmp_path / "mlruns"),
    ):
        check_tracking_uri(uri)
    assert sorted(os.listdir(tmp_path)) == ["m.db"]  # nothing made


def test_a_failure_is_mlflows_or_the_libraries_under_it_never_twices():
    assert mlflow_failure(OSError("connection refused"))
    assert not mlflow_failure(CorruptRecord("damaged")) and not mlflow_failure(ValueError("x"))
    library_error = type("OperationalError", (Exception,), {"__module__": "sqlalchemy.exc"})
    assert mlflow_failure(library_error("locked"))
