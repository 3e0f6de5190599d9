"""compose.yaml's one-shot: wait for the S3 store, then create the fleet's bucket (the one
VIDSERVE_STORAGE names) unless it is there. It runs in the vidserve image, with the fleet's
settings and credentials, so it works against any S3-compatible store."""

import sys
import time

from botocore.exceptions import BotoCoreError, ClientError

from vidserve.config import get_settings
from vidserve.storage import open_storage

WAIT_SECONDS = 180

storage = open_storage(get_settings())
deadline = time.monotonic() + WAIT_SECONDS
while True:
    try:
        storage.client.create_bucket(Bucket=storage.bucket)
        print(f"created bucket {storage.bucket}")
        break
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            print(f"bucket {storage.bucket} is there")
            break
        problem = exc
    except BotoCoreError as exc:  # not answering yet
        problem = exc
    if time.monotonic() > deadline:
        sys.exit(f"the S3 store at {storage.client.meta.endpoint_url} did not take the bucket "
                 f"{storage.bucket} within {WAIT_SECONDS} s: {problem}")
    time.sleep(1)
