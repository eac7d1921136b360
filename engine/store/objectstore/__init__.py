"""The warehouse's storage interface: one `ObjectStore`, on a local folder or on S3.

`WarehouseLocation.parse(uri).open()` gives the store of a `--warehouse`; `location` also maps the
URIs and settings delta-rs and Spark need for the same warehouse.
"""

from engine.store.objectstore.base import (
    DEFAULT_CHUNK_SIZE,
    ObjectExistsError,
    ObjectMeta,
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreError,
    PreconditionFailedError,
    StoredObject,
)
from engine.store.objectstore.location import WarehouseLocation, to_delta_uri, to_spark_uri
from engine.store.objectstore.s3_settings import S3Settings

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "ObjectExistsError",
    "ObjectMeta",
    "ObjectNotFoundError",
    "ObjectStore",
    "ObjectStoreError",
    "PreconditionFailedError",
    "S3Settings",
    "StoredObject",
    "WarehouseLocation",
    "to_delta_uri",
    "to_spark_uri",
]
