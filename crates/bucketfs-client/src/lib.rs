//! bucketfs's store client, the lowest layer: [`store`] is the only code that speaks S3
//! (requests, retries, throttling, several endpoints, the error type the layers above
//! reason about); [`metrics`] is what every layer counts. Nothing here knows about files,
//! inodes or FUSE. See docs/ARCHITECTURE.md.

pub mod metrics;
pub mod store;
