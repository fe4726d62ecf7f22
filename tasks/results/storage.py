"""S3-compatible artifact storage through boto3: the only module that talks to S3.

Endpoint and credentials come from the standard variables, so the same code talks to the
embedded server, MinIO or AWS: ``AWS_ENDPOINT_URL`` (or ``MLFLOW_S3_ENDPOINT_URL``),
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``. Credentials are never
written to params, logs, tags or artifacts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fedcore.errors import FedaptError, mask_credentials


class StorageError(FedaptError):
    """The S3 endpoint cannot be used; the message names it and the variable to fix."""


def endpoint_url() -> str | None:
    """The S3 endpoint from the environment (None: AWS S3 itself), checked: an
    ``http(s)://host[:port]`` URL, else one line naming the variable."""
    from urllib.parse import urlsplit

    for var in ("AWS_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL"):
        url = os.environ.get(var)
        if not url:
            continue
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - a port that is not a number raises ValueError
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise StorageError(
                f"{var}: {mask_credentials(url)} is not an S3 endpoint URL; give "
                "http(s)://HOST[:PORT], e.g. http://127.0.0.1:8333"
            )
        return url
    return None


def _session() -> Any:
    """A fresh boto3 session; an unknown ``AWS_PROFILE`` is one line naming the known ones."""
    import boto3
    import botocore.session
    from botocore.exceptions import ProfileNotFound

    try:
        return boto3.session.Session()
    except ProfileNotFound:
        name = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE")
        known = ", ".join(sorted(botocore.session.Session().available_profiles)) or "none"
        raise StorageError(
            f"AWS_PROFILE: unknown profile {name!r}; known: {known} (~/.aws/config, "
            "~/.aws/credentials); unset AWS_PROFILE or name one of them"
        ) from None


def s3_client(attempts: int = 3) -> Any:
    from botocore.config import Config

    cfg = Config(
        retries={"max_attempts": attempts, "mode": "standard"},
        connect_timeout=5,
        read_timeout=30,
        s3={"addressing_style": "path"},  # SeaweedFS / MinIO style endpoints
    )
    # A fresh session each time: the default session caches the first credentials it finds,
    # so a long-lived process (a Prefect worker, the tests) would keep using stale keys.
    from botocore.exceptions import InvalidRegionError

    region = os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    try:
        return _session().client("s3", endpoint_url=endpoint_url(), region_name=region, config=cfg)
    except InvalidRegionError:
        raise StorageError(
            f"AWS_DEFAULT_REGION: {region!r} is not a region name; give one such as us-east-1 "
            "(or unset it)"
        ) from None


def _explain(exc: Exception, bucket: str) -> StorageError:
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    where = mask_credentials(endpoint_url() or "AWS S3 (no AWS_ENDPOINT_URL set)")
    if isinstance(exc, NoCredentialsError):
        return StorageError(
            f"no S3 credentials for {where}; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        )
    if isinstance(exc, EndpointConnectionError):
        return StorageError(f"S3 endpoint {where} is not reachable; check AWS_ENDPOINT_URL")
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "?")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"):
            return StorageError(
                f"S3 endpoint {where} refused the credentials ({code}); check AWS_ACCESS_KEY_ID "
                "and AWS_SECRET_ACCESS_KEY"
            )
        return StorageError(f"S3 error {code} on bucket {bucket!r} at {where}")
    return StorageError(f"S3 endpoint {where} failed: {type(exc).__name__}; check AWS_ENDPOINT_URL")


def experiment_prefix(prefix: str | None, experiment: str) -> str:
    """The key prefix of an experiment's outputs, ``<storage.prefix>/<experiment>`` (the
    experiment alone for a null ``storage.prefix``, the bucket's top; ``tasks.config`` normalised it: no
    ``..``, no leading or doubled ``/``)."""
    return "/".join(p for p in ((prefix or "").strip("/"), experiment) if p)


def ensure_bucket(bucket: str, client: Any | None = None) -> None:
    client = client or s3_client()
    try:
        client.head_bucket(Bucket=bucket)
        return
    except Exception as exc:  # noqa: BLE001 - classified below
        from botocore.exceptions import ClientError

        missing = isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in (
            "404",
            "NoSuchBucket",
        )
        if not missing:
            raise _explain(exc, bucket) from None
    try:
        client.create_bucket(Bucket=bucket)
    except Exception as exc:  # noqa: BLE001
        from botocore.exceptions import ClientError

        code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else None
        if code == "BucketAlreadyOwnedByYou":  # another run created it meanwhile: ours to use
            return
        raise _explain(exc, bucket) from None


def upload_tree(local_dir: str | Path, bucket: str, prefix: str) -> list[str]:
    """Upload every file under ``local_dir`` to s3://bucket/prefix/...; returns the keys."""
    client = s3_client()
    ensure_bucket(bucket, client)
    root = Path(local_dir)
    keys = []
    # not the run's lock file (flows/services/locks.py; named here to keep this module light)
    files = (p for p in root.rglob("*") if p.is_file() and p.name != ".fedapt.lock")
    for path in sorted(files):
        key = f"{prefix.strip('/')}/{path.relative_to(root).as_posix()}"
        try:
            client.upload_file(str(path), bucket, key)
        except Exception as exc:  # noqa: BLE001
            raise _explain(exc, bucket) from None
        keys.append(key)
    return keys


def read_json(bucket: str, key: str) -> Any | None:
    """The JSON object at s3://bucket/key; None when the bucket or the key does not exist."""
    import json

    from botocore.exceptions import ClientError

    client = s3_client()
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "NoSuchBucket", "404"):
            return None
        raise _explain(exc, bucket) from None
    except Exception as exc:  # noqa: BLE001
        raise _explain(exc, bucket) from None
    try:
        return json.loads(body)
    except ValueError:
        raise StorageError(f"s3://{bucket}/{key} is not JSON; move it away to rerun") from None
