"""boto3 storage against an in-process S3 server (moto) on 127.0.0.1."""

from __future__ import annotations

import pytest

from tasks.results import storage


def test_upload_tree_round_trip(tmp_path, s3_env):
    (tmp_path / "partition").mkdir()
    (tmp_path / "partition/manifest.csv").write_text("client_id,sample_index,label\n0,1,2\n")
    (tmp_path / "summary.json").write_text("{}\n")
    keys = storage.upload_tree(tmp_path, "fedapt-artifacts", "exp1")
    assert keys == ["exp1/partition/manifest.csv", "exp1/summary.json"]
    client = storage.s3_client()
    listed = client.list_objects_v2(Bucket="fedapt-artifacts", Prefix="exp1/")["Contents"]
    assert [o["Key"] for o in listed] == keys
    body = client.get_object(Bucket="fedapt-artifacts", Key=keys[0])["Body"].read()
    assert body.startswith(b"client_id")


def test_unreachable_endpoint_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(
        storage.StorageError, match="127.0.0.1:9 is not reachable; check AWS_ENDPOINT_URL"
    ) as exc:
        storage.upload_tree(tmp_path, "b", "p")
    assert "\n" not in str(exc.value) and "testing" not in str(exc.value)


def test_a_bucket_created_meanwhile_by_another_run_is_used():
    """Two runs starting together: both see no bucket, both create it; the second one's
    BucketAlreadyOwnedByYou means the bucket is there for it (a CI race, now a case)."""
    from botocore.exceptions import ClientError

    from tasks.results.storage import ensure_bucket

    class Racing:
        def head_bucket(self, Bucket):  # noqa: N803 - boto3's keyword
            raise ClientError({"Error": {"Code": "404"}}, "HeadBucket")

        def create_bucket(self, Bucket):  # noqa: N803
            raise ClientError({"Error": {"Code": "BucketAlreadyOwnedByYou"}}, "CreateBucket")

    ensure_bucket("fedapt", Racing())
