//! Bucket storage on MongoDB (any server ≥ 7 speaking its wire protocol).

mod changes;
mod classify;
mod connection;
mod dead_letters;
mod delete;
mod driver_cpu;
mod give_way;
mod in_flight;
mod indexes;
mod instances;
mod losses;
mod metadata;
mod pace;
mod read;
mod registry;
mod replies;
mod rollup;
mod series_finds;
mod settings;
mod shapes;
mod share;
mod sink;
mod surface;
mod tombstones;
mod write;

pub use connection::MongoStore;
pub use dead_letters::{MAX_LISTED as MAX_LISTED_DEAD_LETTERS, Redriven};
pub use instances::{Beat, InstanceInfo, Others};
pub use losses::Loss;
pub use settings::{BlockCompressor, Settings};
