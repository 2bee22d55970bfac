//! The HTTP server, with the bounds `axum::serve` does not set: hyper's
//! connection builder with a timer, HTTP/2 limits, a first request head
//! due within `http.header_read_timeout` (HTTP/1 and HTTP/2 alike, the
//! preface included), an idle timeout that counts requests and their
//! bodies, not bytes (so HTTP/2 PINGs keep nothing open), and at most
//! `http.max_connections` connections, where one that has not sent a
//! request head gives way to a new one.
//!
//! - [`accept`]: the accept loop and who gives way at the cap.
//! - [`connection`]: one connection, driven until it ends, idles, stalls or
//!   gives way.
//! - [`progress`]: what a connection has done (its requests and their
//!   bodies), and the pure verdicts on it.

mod accept;
mod connection;
mod progress;

pub use accept::serve;
