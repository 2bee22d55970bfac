//! Bearer-token authentication and authorization.
//!
//! Tokens are configured by the SHA-256 of their value (`hourglass hash-token`),
//! so the configuration holds no secret. A presented token is hashed and
//! compared with every configured hash in constant time. A token has scopes
//! (`ingest`, `query`) and, for device tokens, the sensor-id patterns it may
//! write and read. Tokens also come from `auth.tokens_file`, and the set in
//! force is replaced whole when they are reloaded (`keyring`).

mod keyring;
mod tokens;

pub use keyring::Keyring;
pub use tokens::{
    AuthConfigError, AuthError, Principal, Scope, Settings, TokenSettings, hash_token,
    presented_token, read_bounded,
};
