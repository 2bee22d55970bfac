//! Tokens, their settings and the checks of a request against them.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::http::HeaderValue;
use figment::providers::Format;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use wildmatch::WildMatch;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// `POST /api/v1/readings`.
    Ingest,
    /// `GET /api/v1/sensors/...`.
    Query,
    /// `DELETE /api/v1/readings`: never a device token's.
    Admin,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSettings {
    /// Shown in logs instead of the token.
    pub name: String,
    /// Hex SHA-256 of the token: `printf %s "$TOKEN" | hourglass hash-token`.
    pub sha256: String,
    pub scopes: Vec<Scope>,
    /// Sensor-id patterns (`*` matches any run of characters, `?` one) this
    /// token may write and read. Absent: every sensor.
    #[serde(default)]
    pub sensors: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Off: anyone who reaches the port may write and read (local development).
    pub enabled: bool,
    pub tokens: Vec<TokenSettings>,
    /// A TOML file of more `[[tokens]]`, read at start and again whenever
    /// it changes (or on SIGHUP): tokens rotate without a restart.
    pub tokens_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AuthConfigError {
    #[error("auth.enabled is true but auth.tokens is empty: nobody could use the service")]
    NoTokens,
    #[error("auth.tokens[{0}].name must be non-empty and unique")]
    Name(usize),
    #[error("auth.tokens[{0}].sha256 must be 64 hex characters (see `hourglass hash-token`)")]
    Hash(usize),
    #[error("auth.tokens[{0}].scopes must name at least one of ingest, query, admin")]
    Scopes(usize),
    #[error(
        "auth.tokens[{0}] has the admin scope and sensor patterns: a device token may not delete; give admin to a token without sensors"
    )]
    DeviceAdmin(usize),
    #[error("auth.tokens[{0}].sensors must hold non-empty patterns")]
    Sensors(usize),
    #[error("auth.tokens_file {path}: {reason}")]
    File { path: String, reason: String },
    #[error("auth.enabled changes only with a restart")]
    EnabledChanged,
    #[error("auth.tokens_file changes only with a restart")]
    TokensFileChanged,
    #[error("auth.tokens[{0}] is the same token as one listed before it (its sha256)")]
    SameToken(usize),
}

/// Why a request may not go on; `api` turns it into 401 or 403.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("a valid bearer token is required")]
    NoToken,
    #[error("token {token:?} lacks the {scope:?} scope")]
    Scope { token: String, scope: Scope },
    #[error("token {token:?} may not access sensor {sensor:?}")]
    Sensor { token: String, sensor: String },
}

/// The hex SHA-256 of a token, as `auth.tokens[].sha256` wants it.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

struct Token {
    name: String,
    hash: [u8; 32],
    scopes: Vec<Scope>,
    sensors: Option<Vec<WildMatch>>,
}

/// The configured tokens, ready to check requests against.
pub struct Authenticator {
    enabled: bool,
    tokens: Vec<Token>,
}

impl Settings {
    pub fn validate(&self) -> Result<(), AuthConfigError> {
        self.build().map(|_| ())
    }

    /// The tokens of `auth.tokens` and of `auth.tokens_file` (read now),
    /// checked; a fault names the key (and the file).
    pub fn build(&self) -> Result<Authenticator, AuthConfigError> {
        let text = match &self.tokens_file {
            Some(path) => Some(read_bounded(path).map_err(|e| file_fault(path, e.to_string()))?),
            None => None,
        };
        self.build_with(text.as_deref())
    }

    /// [`Self::build`] with the tokens file's `text` as read (a reload
    /// checks and applies the very bytes it saw change).
    pub fn build_with(&self, text: Option<&str>) -> Result<Authenticator, AuthConfigError> {
        let from_file = match (&self.tokens_file, text) {
            (Some(path), Some(text)) => parse_tokens_file(path, text)?,
            (Some(path), None) => return Err(file_fault(path, "unreadable".to_owned())),
            (None, _) => Vec::new(),
        };
        let all: Vec<&TokenSettings> = self.tokens.iter().chain(&from_file).collect();
        let named = |e: AuthConfigError| match (&self.tokens_file, e) {
            (Some(path), e) if e.index().is_some_and(|i| i >= self.tokens.len()) => {
                AuthConfigError::File {
                    path: path.display().to_string(),
                    reason: e.renumbered(self.tokens.len()).to_string(),
                }
            }
            (_, e) => e,
        };
        Self::check(self.enabled, &all).map_err(named)
    }

    fn check(enabled: bool, all: &[&TokenSettings]) -> Result<Authenticator, AuthConfigError> {
        if enabled && all.is_empty() {
            return Err(AuthConfigError::NoTokens);
        }
        let mut tokens = Vec::with_capacity(all.len());
        let mut names = std::collections::HashSet::with_capacity(all.len());
        let mut hashes = std::collections::HashSet::with_capacity(all.len());
        for (i, t) in all.iter().enumerate() {
            if t.name.is_empty() || !names.insert(t.name.as_str()) {
                return Err(AuthConfigError::Name(i));
            }
            let mut hash = [0u8; 32];
            hex::decode_to_slice(t.sha256.trim(), &mut hash)
                .map_err(|_| AuthConfigError::Hash(i))?;
            // One token under two names: which entry's rights would apply?
            if !hashes.insert(hash) {
                return Err(AuthConfigError::SameToken(i));
            }
            if t.scopes.is_empty() {
                return Err(AuthConfigError::Scopes(i));
            }
            if t.sensors
                .as_ref()
                .is_some_and(|s| s.is_empty() || s.iter().any(String::is_empty))
            {
                return Err(AuthConfigError::Sensors(i));
            }
            if t.sensors.is_some() && t.scopes.contains(&Scope::Admin) {
                return Err(AuthConfigError::DeviceAdmin(i));
            }
            tokens.push(Token {
                name: t.name.clone(),
                hash,
                scopes: t.scopes.clone(),
                sensors: t
                    .sensors
                    .as_ref()
                    .map(|s| s.iter().map(|p| WildMatch::new(p)).collect()),
            });
        }
        Ok(Authenticator { enabled, tokens })
    }
}

impl AuthConfigError {
    /// The token a fault is about.
    fn index(&self) -> Option<usize> {
        match *self {
            Self::Name(i)
            | Self::Hash(i)
            | Self::Scopes(i)
            | Self::DeviceAdmin(i)
            | Self::Sensors(i)
            | Self::SameToken(i) => Some(i),
            _ => None,
        }
    }

    /// The fault with its token counted from `first` (the file's own
    /// numbering), reworded for the file (`tokens[i]`).
    fn renumbered(self, first: usize) -> String {
        let text = match self {
            Self::Name(i) => Self::Name(i - first),
            Self::Hash(i) => Self::Hash(i - first),
            Self::Scopes(i) => Self::Scopes(i - first),
            Self::DeviceAdmin(i) => Self::DeviceAdmin(i - first),
            Self::Sensors(i) => Self::Sensors(i - first),
            Self::SameToken(i) => Self::SameToken(i - first),
            other => other,
        }
        .to_string();
        text.replacen("auth.tokens[", "tokens[", 1)
    }
}

/// A tokens file larger than this is refused (it holds hashes and names).
pub(super) const MAX_FILE_BYTES: u64 = 4 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    tokens: Vec<TokenSettings>,
}

fn file_fault(path: &Path, reason: String) -> AuthConfigError {
    AuthConfigError::File {
        path: path.display().to_string(),
        reason,
    }
}

/// The `[[tokens]]` of `text`, the tokens file at `path`.
fn parse_tokens_file(path: &Path, text: &str) -> Result<Vec<TokenSettings>, AuthConfigError> {
    let file: TokensFile = figment::Figment::from(figment::providers::Toml::string(text))
        .extract()
        .map_err(|e| file_fault(path, e.to_string()))?;
    Ok(file.tokens)
}

/// The `[[tokens]]` of the file at `path`.
#[cfg(test)]
pub(super) fn read_tokens_file(path: &Path) -> Result<Vec<TokenSettings>, AuthConfigError> {
    let text = read_bounded(path).map_err(|e| file_fault(path, e.to_string()))?;
    parse_tokens_file(path, &text)
}

/// The text of the regular file at `path` (a symbolic link followed),
/// refusing anything else (a FIFO would block the reader) and a file over
/// [`MAX_FILE_BYTES`].
pub fn read_bounded(path: &Path) -> std::io::Result<String> {
    if !std::fs::metadata(path)?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {MAX_FILE_BYTES} bytes"
        )));
    }
    Ok(text)
}

/// Who made a request: a configured token, or anyone when auth is off.
#[derive(Clone)]
pub struct Principal {
    auth: Arc<Authenticator>,
    /// Index into the tokens; `None` when auth is off.
    token: Option<usize>,
}

impl Principal {
    fn token(&self) -> Option<&Token> {
        self.token.and_then(|i| self.auth.tokens.get(i))
    }

    /// The token's name when auth is on: who the per-token bounds count.
    pub fn token_name(&self) -> Option<&str> {
        self.token().map(|t| t.name.as_str())
    }

    /// The token's name, for logs; never the token.
    pub fn name(&self) -> &str {
        self.token().map_or("anonymous", |t| t.name.as_str())
    }

    pub fn has(&self, scope: Scope) -> bool {
        self.token().is_none_or(|t| t.scopes.contains(&scope))
    }

    /// May this principal write and read `sensor`?
    pub fn may_access(&self, sensor: &str) -> bool {
        match self.token() {
            None => true,
            Some(t) => t
                .sensors
                .as_ref()
                .is_none_or(|patterns| patterns.iter().any(|p| p.matches(sensor))),
        }
    }

    /// Whether this principal may access every sensor (auth off, or a
    /// token without a `sensors` list).
    pub fn sees_all_sensors(&self) -> bool {
        self.token().is_none_or(|t| t.sensors.is_none())
    }

    /// Refuses the first of `sensors` this principal may not access.
    pub fn check_sensors<'s>(
        &self,
        mut sensors: impl Iterator<Item = &'s str>,
    ) -> Result<(), AuthError> {
        // Not a pass over every reading of a request for nothing.
        if self.sees_all_sensors() {
            return Ok(());
        }
        match sensors.find(|s| !self.may_access(s)) {
            None => Ok(()),
            Some(sensor) => Err(AuthError::Sensor {
                token: self.name().to_owned(),
                sensor: sensor.to_owned(),
            }),
        }
    }
}

impl Authenticator {
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// How many tokens it knows.
    pub fn tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Who presents `authorization`, if they may use a route needing `scope`.
    pub fn authenticate(
        self: &Arc<Self>,
        authorization: Option<&HeaderValue>,
        scope: Scope,
    ) -> Result<Principal, AuthError> {
        let token = authorization.and_then(|a| presented_token(a, false));
        self.authenticate_token(token.as_deref(), scope)
    }

    /// Who presents `token` (from wherever the request carried it), if they
    /// may use a route needing `scope`.
    pub fn authenticate_token(
        self: &Arc<Self>,
        token: Option<&str>,
        scope: Scope,
    ) -> Result<Principal, AuthError> {
        let token = if self.enabled {
            Some(self.identify(token).ok_or(AuthError::NoToken)?)
        } else {
            None
        };
        let principal = Principal {
            auth: self.clone(),
            token,
        };
        if !principal.has(scope) {
            return Err(AuthError::Scope {
                token: principal.name().to_owned(),
                scope,
            });
        }
        Ok(principal)
    }

    /// The index of the token matching `token`, if any.
    fn identify(&self, token: Option<&str>) -> Option<usize> {
        let presented: [u8; 32] = Sha256::digest(token?.trim().as_bytes()).into();
        // Compare against every token, without stopping at a match, so the
        // time taken says nothing about which hash matched or how closely.
        let mut found = None;
        for (i, t) in self.tokens.iter().enumerate() {
            if bool::from(t.hash.ct_eq(&presented)) {
                found = Some(i);
            }
        }
        found
    }
}

/// The token of an `Authorization` header: `Bearer <token>`; with
/// `influx`, also `Token <token>` (InfluxDB's clients) and `Basic` with the
/// token as the password (any user name: InfluxDB 1.x clients and Telegraf's
/// username/password settings). Hourglass' own API takes bearer tokens only.
pub fn presented_token(authorization: &HeaderValue, influx: bool) -> Option<String> {
    use base64::Engine as _;
    let value = authorization.to_str().ok()?;
    let (scheme, rest) = value.split_once(' ')?;
    if scheme.eq_ignore_ascii_case("bearer") || (influx && scheme.eq_ignore_ascii_case("token")) {
        return Some(rest.trim().to_owned());
    }
    if influx && scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest.trim())
            .ok()?;
        let decoded = String::from_utf8(decoded).ok()?;
        return decoded
            .split_once(':')
            .map(|(_, password)| password.to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            enabled: true,
            tokens: vec![
                TokenSettings {
                    name: "dashboard".into(),
                    sha256: hash_token("q-secret"),
                    scopes: vec![Scope::Query],
                    sensors: None,
                },
                TokenSettings {
                    name: "truck-17".into(),
                    sha256: hash_token("d-secret"),
                    scopes: vec![Scope::Ingest, Scope::Query],
                    sensors: Some(vec!["truck-17".into(), "truck-17.*".into()]),
                },
            ],
            tokens_file: None,
        }
    }

    fn principal(auth: &Arc<Authenticator>, header: &str) -> Option<Principal> {
        let value = HeaderValue::from_str(header).ok()?;
        auth.identify(presented_token(&value, true).as_deref())
            .map(|token| Principal {
                auth: auth.clone(),
                token: Some(token),
            })
    }

    #[test]
    fn tokens_are_recognised_by_their_hash_only() {
        let auth = Arc::new(settings().build().expect("valid"));
        assert_eq!(
            principal(&auth, "Bearer q-secret").map(|p| p.name().to_owned()),
            Some("dashboard".into())
        );
        assert_eq!(
            principal(&auth, "bearer d-secret").map(|p| p.name().to_owned()),
            Some("truck-17".into())
        );
        for bad in [
            "Bearer nope",
            "Basic q-secret",
            "q-secret",
            "Bearer",
            "Bearer  ",
        ] {
            assert!(principal(&auth, bad).is_none(), "{bad:?}");
        }
        assert!(auth.identify(None).is_none());
    }

    #[test]
    fn influx_clients_present_tokens_as_token_or_basic_password() {
        use base64::Engine as _;
        let auth = Arc::new(settings().build().expect("valid"));
        let basic = |s: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        for good in [
            "Token q-secret",
            "token  q-secret ",
            &basic("telegraf:q-secret"),
            &basic(":q-secret"),
        ] {
            assert_eq!(
                principal(&auth, good).map(|p| p.name().to_owned()),
                Some("dashboard".into()),
                "{good:?}"
            );
        }
        for bad in [
            basic("q-secret"),
            basic("q-secret:x"),
            "Basic !!".into(),
            "Digest q-secret".into(),
        ] {
            assert!(principal(&auth, &bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn scopes_and_sensor_patterns_limit_what_a_token_may_do() {
        let auth = Arc::new(settings().build().expect("valid"));
        let dashboard = principal(&auth, "Bearer q-secret").expect("known");
        assert!(dashboard.has(Scope::Query) && !dashboard.has(Scope::Ingest));
        assert!(dashboard.may_access("anything"));
        let device = principal(&auth, "Bearer d-secret").expect("known");
        assert!(device.may_access("truck-17") && device.may_access("truck-17.engine"));
        assert!(!device.may_access("truck-170") && !device.may_access("truck-18"));
        assert_eq!(
            device.check_sensors(["truck-17", "truck-18"].into_iter()),
            Err(AuthError::Sensor {
                token: "truck-17".into(),
                sensor: "truck-18".into()
            })
        );
        let open = Principal {
            auth: auth.clone(),
            token: None,
        };
        assert!(
            open.has(Scope::Ingest) && open.may_access("x"),
            "auth off allows everything"
        );
    }

    #[test]
    fn authentication_needs_a_known_token_with_the_scope() {
        let auth = Arc::new(settings().build().expect("valid"));
        let header = |v: &str| HeaderValue::from_str(v).expect("header");
        assert_eq!(
            auth.authenticate(None, Scope::Query).err(),
            Some(AuthError::NoToken)
        );
        assert_eq!(
            auth.authenticate(Some(&header("Bearer q-secret")), Scope::Ingest)
                .err(),
            Some(AuthError::Scope {
                token: "dashboard".into(),
                scope: Scope::Ingest
            })
        );
        let ok = auth
            .authenticate(Some(&header("Bearer q-secret")), Scope::Query)
            .expect("allowed");
        assert_eq!(ok.name(), "dashboard");
        let off = Arc::new(Settings::default().build().expect("valid"));
        assert!(off.authenticate(None, Scope::Ingest).is_ok());
    }

    #[test]
    fn bad_token_settings_are_refused_with_the_entry_named() {
        let mut s = settings();
        s.tokens[1].sha256 = "abc".into();
        assert_eq!(s.validate(), Err(AuthConfigError::Hash(1)));
        let mut s = settings();
        s.tokens[1].name = "dashboard".into();
        assert_eq!(s.validate(), Err(AuthConfigError::Name(1)));
        let mut s = settings();
        s.tokens[0].scopes.clear();
        assert_eq!(s.validate(), Err(AuthConfigError::Scopes(0)));
        let mut s = settings();
        s.tokens[1].sensors = Some(vec![]);
        assert_eq!(s.validate(), Err(AuthConfigError::Sensors(1)));
        assert_eq!(
            Settings {
                enabled: true,
                ..Settings::default()
            }
            .validate(),
            Err(AuthConfigError::NoTokens)
        );
        assert!(
            Settings::default().validate().is_ok(),
            "off needs no tokens"
        );
    }

    #[test]
    fn hash_token_is_hex_sha256() {
        assert_eq!(
            hash_token("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
