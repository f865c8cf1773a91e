from kvstore.stores import BlobNotFound as BlobNotFound
from kvstore.stores import BlobStore as BlobStore
from kvstore.stores import StoreCorrupted as StoreCorrupted
from kvstore.stores import StoreError as StoreError
from kvstore.stores import StoreFull as StoreFull
from kvstore.stores import StoreUnavailable as StoreUnavailable
from kvstore.stores import new_blob_key as new_blob_key
from kvstore.stores import open_store as open_store
