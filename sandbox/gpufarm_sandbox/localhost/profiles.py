"""Profiler runs locally: S3 is moto's server on a loopback port, uploads go through the local host's
profile_upload function and pages come from its profile_pages function.

`gpufarm profile upload` runs in another process than `gpufarm local` (a researcher's shell, the demo's) and holds
only an upload token and GPUFARM_API_URL (the local profile_upload function's URL, yielded here): it PUTs each
trace to the presigned URL the function gives, so the bucket must be reachable over HTTP. moto's threaded server
listens on 127.0.0.1, with presigned URLs checked as S3 checks them (localhost.s3_server), and the functions'
botocore is pointed at it with AWS_ENDPOINT_URL_S3, which every botocore client honours (nothing in gpufarm's
code knows it is local). The bucket is made with the deployment's shape (no public access, encryption, the farm's
retention on profiles/ and a day on incoming/ as lifecycle). Started only when asked (`gpufarm local --profiles`,
the demo): moto's server costs about 1.5 s to start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

BUCKET = "gpufarm-profiles-local"
REGION = "us-east-1"
ACCESS_KEY = "AKIAGPUFARMPROFILES1"  # moto's stand-in credential; nothing here reaches AWS
SECRET_KEY = "gpufarm-local-not-a-secret"  # noqa: S105 - moto accepts any
LINK_SECRET = "gpufarm-local-profile-links"  # noqa: S105 - signs local page links only


@contextmanager
def local_profiles(pages_url: str, upload_url: str, retention_days: int = 30) -> Iterator[dict[str, str]]:
    """Start moto's S3 server with the profile bucket; yields the variables that point gpufarm at it."""
    import botocore.session
    from botocore.config import Config

    from gpufarm_sandbox.localhost.s3_server import CheckedMotoServer

    # moto's server logs each request through werkzeug's logger at INFO (the sandbox's own server does not use it).
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = CheckedMotoServer({ACCESS_KEY: SECRET_KEY})
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        s3: Any = botocore.session.get_session().create_client(
            "s3",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(signature_version="s3v4"),
        )
        s3.create_bucket(Bucket=BUCKET)
        s3.put_public_access_block(
            Bucket=BUCKET,
            PublicAccessBlockConfiguration={
                "BlockPublicAcls": True,
                "IgnorePublicAcls": True,
                "BlockPublicPolicy": True,
                "RestrictPublicBuckets": True,
            },
        )
        s3.put_bucket_encryption(
            Bucket=BUCKET,
            ServerSideEncryptionConfiguration={
                "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
            },
        )
        s3.put_bucket_lifecycle_configuration(
            Bucket=BUCKET,
            LifecycleConfiguration={
                "Rules": [
                    {
                        "ID": "profile-retention",
                        "Status": "Enabled",
                        "Filter": {"Prefix": "profiles/"},
                        "Expiration": {"Days": retention_days},
                    },
                    {
                        "ID": "incoming-uploads",
                        "Status": "Enabled",
                        "Filter": {"Prefix": "incoming/"},
                        "Expiration": {"Days": 1},
                    },
                ]
            },
        )
        yield {
            "AWS_ENDPOINT_URL_S3": endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "GPUFARM_PROFILE_BUCKET": BUCKET,
            "GPUFARM_PROFILE_PAGES_URL": pages_url,
            "GPUFARM_PROFILE_LINK_SECRET": LINK_SECRET,
            # What a researcher's `gpufarm profile upload` needs besides its upload token.
            "GPUFARM_API_URL": upload_url,
        }
    finally:
        server.stop()
