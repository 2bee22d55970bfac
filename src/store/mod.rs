//! Bucket storage on MongoDB: what is stored, how, and the reads of it.

mod answers;
pub mod command;
pub mod delete;
pub mod document;
pub mod errors;
pub mod floor;
pub mod mongo;
pub mod raw_writer;
pub mod registry;
pub mod rollup;
mod settings;

pub use answers::{
    BucketStream, Change, DeadLetterInfo, Doc, Fetch, LateMarks, Read, StoredBucket,
};
pub use document::SCHEMA_VERSION;
pub use errors::StoreError;

pub use crate::domain::Labels;
pub use mongo::{BlockCompressor, InstanceInfo, MongoStore, Redriven};
pub use registry::{Quiet, SensorInfo, SensorQuery};
pub use settings::{BucketSettings, Keep, Retention, RetentionSettings};
