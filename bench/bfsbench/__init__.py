"""bucketfs benchmark suite: drives MinIO, the FUSE mounts under test and the direct client."""
