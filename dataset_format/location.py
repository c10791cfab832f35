"""Where a dataset lives: a local directory or an object-store prefix (`s3://bucket/prefix`), and the pyarrow
filesystem that reaches it. Every reader and writer of the format goes through a `Location`, so each takes either.

S3 credentials come from the usual AWS variables or files; an S3-compatible server (MinIO, moto) is reached through
`AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`, as boto3 reads them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.fs as pafs

from common.errors import UserError, first_line

S3_SCHEME = "s3://"


@dataclass(frozen=True)
class Location:
    uri: str
    """As the user gave it: a local path, or s3://bucket/prefix."""
    fs: pafs.FileSystem
    """The pyarrow filesystem that reaches it."""
    root: str
    """Its path inside `fs`: an absolute local path, or bucket/prefix."""

    def __str__(self) -> str:
        return self.uri

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def name(self) -> str:
        return self.root.rstrip("/").rsplit("/", 1)[-1]

    def path(self, name: str) -> str:
        """The path inside `fs` of the object `name` in this directory."""
        return f"{self.root}/{name}"

    def uri_of(self, name: str) -> str:
        """What to show a person for the object `name` in this directory."""
        return f"{self.uri.rstrip('/')}/{name}"

    def files(self) -> list[str]:
        """Names of the objects directly in this directory (none if it does not exist)."""
        with storage_errors(self):
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        return sorted(info.base_name for info in infos if info.type == pafs.FileType.File)

    def children(self) -> list[Location]:
        """The directories (prefixes) directly in this one."""
        with storage_errors(self):
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        return [Location(self.uri_of(info.base_name), self.fs, info.path)
                for info in sorted(infos, key=lambda info: info.base_name) if info.type == pafs.FileType.Directory]

    def exists(self) -> bool:
        """A local directory, or a prefix with objects under it (in a bucket that must exist)."""
        if self.is_local:
            return Path(self.root).is_dir()
        with storage_errors(self):
            found = self.fs.get_file_info(self.root).type != pafs.FileType.NotFound
        if not found:
            self.require_bucket()
        return found

    def require_bucket(self) -> None:
        """Raises a UserError naming the bucket if it does not exist (object storage only)."""
        bucket = self.root.split("/", 1)[0]
        with storage_errors(self):
            missing = self.fs.get_file_info(bucket).type == pafs.FileType.NotFound
        if missing:
            raise UserError(f"{self}: bucket '{bucket}' does not exist at the S3 endpoint "
                            f"{s3_endpoint() or 'of AWS'}; create it or fix the URI")

    def is_file(self, name: str) -> bool:
        with storage_errors(self):
            return self.fs.get_file_info(self.path(name)).type == pafs.FileType.File

    def read_text(self, name: str) -> str:
        with storage_errors(self), self.fs.open_input_stream(self.path(name)) as stream:
            return stream.read().decode()

    def write_text(self, name: str, text: str) -> None:
        with storage_errors(self), self.fs.open_output_stream(self.path(name)) as stream:
            stream.write(text.encode())

    def size(self, name: str) -> int:
        with storage_errors(self):
            return self.fs.get_file_info(self.path(name)).size

    def delete(self, names: list[str]) -> None:
        with storage_errors(self):
            for name in names:
                self.fs.delete_file(self.path(name))


def locate(path: str | os.PathLike | Location) -> Location:
    """The Location of a local path or an s3:// URI."""
    if isinstance(path, Location):
        return path
    text = str(path)
    if text.startswith(S3_SCHEME):
        bucket_and_prefix = text[len(S3_SCHEME):].strip("/")
        if not bucket_and_prefix:
            raise UserError(f"{text} names no bucket; use s3://BUCKET/PREFIX")
        return Location(text.rstrip("/"), s3_filesystem(), bucket_and_prefix)
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", text):
        raise UserError(f"{text}: only local paths and s3://BUCKET/PREFIX URIs are supported")
    return Location(text, pafs.LocalFileSystem(), str(Path(text).resolve()))


def s3_endpoint() -> str | None:
    """The S3-compatible endpoint set in the environment, as boto3 reads it (None: AWS itself)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def s3_filesystem() -> pafs.S3FileSystem:
    endpoint, options = s3_endpoint(), {}
    if endpoint:
        parsed = urlparse(endpoint)
        options = {"endpoint_override": parsed.netloc or parsed.path, "scheme": parsed.scheme or "https"}
    # A few quick tries: an endpoint that does not answer fails in seconds, not after the SDK's minutes of retries.
    return pafs.S3FileSystem(**options, connect_timeout=3, request_timeout=30,
                             retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2))


class storage_errors:
    """Turns the object store's errors inside the block into one UserError naming the URI and what to do."""

    def __init__(self, location: Location):
        self.location = location

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is None or self.location.is_local or not isinstance(error, OSError):
            return False
        raise storage_error(self.location, error) from None


def storage_error(location: Location, error: BaseException) -> UserError:
    reason = first_line(error)
    where = f"the S3 endpoint {s3_endpoint() or 'of AWS'}"
    bucket = location.root.split("/", 1)[0]
    if "NETWORK_CONNECTION" in reason or "Couldn't connect" in reason or "curlCode" in reason:
        return UserError(f"{location}: cannot reach {where} ({reason}); start the server or set AWS_ENDPOINT_URL")
    if "NO_SUCH_BUCKET" in reason or "NoSuchBucket" in reason or "bucket does not exist" in reason.lower():
        return UserError(f"{location}: bucket '{bucket}' does not exist at {where}; create it or fix the URI")
    if any(word in reason for word in ("ACCESS_DENIED", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                                        "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "Forbidden")):
        return UserError(f"{location}: {where} refused the credentials ({reason}); set AWS_ACCESS_KEY_ID and "
                         "AWS_SECRET_ACCESS_KEY (or an AWS profile) for it")
    return UserError(f"{location}: the object store failed ({reason}); check the URI and AWS_ENDPOINT_URL")
